fn main() {
    println!("geodwell");
}
