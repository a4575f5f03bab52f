//! The input log's backend, measured (docs/store.md): the same appends, each made durable before
//! the next, into (a) a redb table (`u64 -> bytes`, one write transaction with
//! `Durability::Immediate` per append), (b) a plain file (`write_all` + `fdatasync`) and (c) the
//! store's journal (`geodwell::store::journal::Journal`: the plain file with a CRC-32 and a
//! commit number per record, segments of 16 MiB), once on growing files and once on segments
//! preallocated with zeros (the spare the service keeps), side by side in one run, for record
//! sizes of one fix (~100 B), a small batch (20 KB) and a large one (200 KB).
//!
//!   cargo bench --bench log_backend [-- --appends N]

use std::io::Write;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

struct Row {
    backend: &'static str,
    size: usize,
    p50_ms: f64,
    p99_ms: f64,
    mb_s: f64,
}

fn run(backend: &'static str, size: usize, n: usize, mut append: impl FnMut(u64, &[u8])) -> Row {
    let rec: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    // Warm up the file and the allocator.
    for i in 0..n / 10 {
        append(i as u64, &rec);
    }
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        append((n / 10 + i) as u64, &rec);
        lat.push(t.elapsed());
    }
    let took = started.elapsed().as_secs_f64();
    lat.sort();
    Row {
        backend,
        size,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        mb_s: (n * size) as f64 / took / 1e6,
    }
}

fn main() {
    let mut appends = 2000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--appends") {
        appends = args[i + 1].parse().expect("--appends N");
    }
    let dir = tempfile::Builder::new()
        .prefix("geodwell-logbench-")
        .tempdir_in(std::env::var("LOG_BENCH_DIR").unwrap_or_else(|_| ".".into()))
        .expect("temp dir");
    let mut rows = Vec::new();
    for size in [100usize, 20_000, 200_000] {
        let n = if size >= 200_000 {
            appends / 4
        } else {
            appends
        };
        {
            let path = dir.path().join(format!("log-{size}.redb"));
            let db = Database::builder()
                .set_cache_size(16 << 20)
                .create(&path)
                .unwrap();
            rows.push(run("redb table, commit per append", size, n, |k, rec| {
                let txn = db.begin_write().unwrap();
                {
                    let mut t = txn.open_table(LOG).unwrap();
                    t.insert(k, rec).unwrap();
                }
                txn.commit().unwrap();
            }));
        }
        {
            let path = dir.path().join(format!("log-{size}.bin"));
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            rows.push(run("file, write + fdatasync", size, n, |k, rec| {
                f.write_all(&(rec.len() as u32).to_le_bytes()).unwrap();
                f.write_all(&k.to_le_bytes()).unwrap();
                f.write_all(rec).unwrap();
                f.sync_data().unwrap();
            }));
        }
        {
            let jdir = dir.path().join(format!("journal-{size}"));
            let (mut j, _) = geodwell::store::journal::Journal::open(&jdir, 0).unwrap();
            rows.push(run(
                "journal, growing file (no spare)",
                size,
                n,
                |_, rec| {
                    j.append(rec, true).unwrap();
                },
            ));
        }
        {
            let jdir = dir.path().join(format!("journal-spare-{size}"));
            let (mut j, _) = geodwell::store::journal::Journal::open(&jdir, 0).unwrap();
            j.keep_spares();
            let t0 = Instant::now();
            while !j.spare_ready() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            rows.push(run("journal, preallocated (spare)", size, n, |_, rec| {
                j.append(rec, true).unwrap();
            }));
        }
    }
    println!("\n{appends} durable appends per size (200 KB: a quarter), one after another\n");
    println!("| backend | record bytes | p50 ms | p99 ms | MB/s |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.1} |",
            r.backend, r.size, r.p50_ms, r.p99_ms, r.mb_s
        );
    }
    for size in [100usize, 20_000, 200_000] {
        let pick = |b: &str| {
            rows.iter()
                .find(|r| r.size == size && r.backend.starts_with(b))
                .unwrap()
        };
        let (redb, file, journal) = (pick("redb"), pick("file"), pick("journal, growing"));
        let pre = pick("journal, prealloc");
        println!(
            "{size} B: redb p50 {:.2}x the file's, p99 {:.2}x, throughput {:.2}x; the journal p50 {:.2}x the file's, p99 {:.2}x; preallocated p50 {:.2}x the growing journal's, p99 {:.2}x",
            redb.p50_ms / file.p50_ms,
            redb.p99_ms / file.p99_ms,
            redb.mb_s / file.mb_s,
            journal.p50_ms / file.p50_ms,
            journal.p99_ms / file.p99_ms,
            pre.p50_ms / journal.p50_ms,
            pre.p99_ms / journal.p99_ms
        );
    }
}
