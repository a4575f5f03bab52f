//! Which node should own what (pure): rendezvous hashing over the live nodes.
//!
//! Every node computes the same ranking from the same live set, with no coordination: node `n`'s
//! score for item `k` is a hash of both, and the nodes ordered by score are `k`'s preference
//! list. When a node joins, only the items it now ranks first move to it (about `1/N` of them);
//! when one leaves, only its items move, spread over the rest.

/// Node `node`'s score for item `key` (a partition number or a webhook sink id).
pub fn score(node: &str, key: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(node.len() + key.len() + 1);
    buf.extend_from_slice(node.as_bytes());
    buf.push(0);
    buf.extend_from_slice(key);
    xxhash_rust::xxh3::xxh3_64(&buf)
}

/// The key of partition `p`.
pub fn partition_key(p: u16) -> [u8; 2] {
    p.to_le_bytes()
}

/// `nodes` in order of preference for `key` (ties, which need equal hashes, by id).
pub fn rank<'a>(key: &[u8], nodes: &'a [String]) -> Vec<&'a str> {
    let mut r: Vec<(u64, &str)> = nodes.iter().map(|n| (score(n, key), n.as_str())).collect();
    r.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    r.into_iter().map(|(_, n)| n).collect()
}

/// Where `node` stands in `key`'s preference list (`None`: not a live node).
pub fn position(key: &[u8], nodes: &[String], node: &str) -> Option<usize> {
    rank(key, nodes).iter().position(|n| *n == node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn owners(partitions: u16, live: &[String]) -> Vec<String> {
        (0..partitions)
            .map(|p| rank(&partition_key(p), live)[0].to_string())
            .collect()
    }

    #[test]
    fn partitions_spread_over_nodes() {
        let live = nodes(3);
        let o = owners(64, &live);
        for n in &live {
            let c = o.iter().filter(|x| *x == n).count();
            assert!((10..=34).contains(&c), "{n} owns {c} of 64");
        }
    }

    #[test]
    fn a_leaving_node_moves_only_its_partitions_and_a_joining_one_takes_only_its_share() {
        let three = nodes(3);
        let before = owners(64, &three);
        let two: Vec<String> = three[..2].to_vec();
        let after = owners(64, &two);
        for p in 0..64 {
            if before[p] != three[2] {
                assert_eq!(before[p], after[p], "partition {p} moved without need");
            }
        }
        let four = nodes(4);
        let joined = owners(64, &four);
        let moved: Vec<usize> = (0..64).filter(|&p| joined[p] != before[p]).collect();
        assert!(
            moved.iter().all(|&p| joined[p] == four[3]),
            "only to the new node"
        );
        assert!(moved.len() < 32, "{} of 64 moved", moved.len());
    }

    #[test]
    fn every_node_ranks_alike_whatever_the_order_it_lists_nodes_in() {
        let a = nodes(5);
        let mut b = a.clone();
        b.reverse();
        for p in 0..16u16 {
            assert_eq!(rank(&partition_key(p), &a), rank(&partition_key(p), &b));
        }
        assert_eq!(position(b"sink", &a, "nope"), None);
        assert!(position(b"sink", &a, "node-1").is_some());
    }
}
