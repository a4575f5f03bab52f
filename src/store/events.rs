//! The stored event log: one row per commit, not per event. A row ("page") is keyed by the
//! `seq` of its first event and holds the JSON text of that commit's events, whose `seq`s are
//! consecutive (the publisher numbers them in commit order). One insert per commit instead of
//! one per event keeps the commit that answers ingest short (measured: about 1 ms of a 2.6 ms
//! commit was the per-event inserts at 450 events per commit).
//!
//! Page layout: `uv count`, then per event `uv len` and the UTF-8 JSON text.
//!
//! Invariants: pages do not overlap and, trimmed only from the front, cover one unbroken range
//! of `seq`s; a trim deletes whole pages, so it keeps the events of a page that straddles the
//! trim point (retention keeps at least what it must).

use std::sync::Arc;

use redb::{ReadableTable, TableDefinition};

use super::codec::{DecodeError, Reader, put_uv};

/// `first seq -> page`.
pub(crate) const EVENT_PAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("event_pages");

/// Encodes the events of one commit (consecutive `seq`s) as a page.
pub(crate) fn encode_page(events: &[(u64, Arc<str>)]) -> Vec<u8> {
    debug_assert!(events.windows(2).all(|w| w[1].0 == w[0].0 + 1));
    let mut out = Vec::with_capacity(8 + events.iter().map(|e| e.1.len() + 3).sum::<usize>());
    put_uv(&mut out, events.len() as u64);
    for (_, json) in events {
        put_uv(&mut out, json.len() as u64);
        out.extend_from_slice(json.as_bytes());
    }
    out
}

/// Decodes a page whose first event has `seq = first`: `(seq, JSON)` in order.
pub(crate) fn decode_page(first: u64, bytes: &[u8]) -> Result<Vec<(u64, &str)>, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let n = r.count()?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push((first + i as u64, r.str()?));
    }
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(out)
}

fn bad(first: u64, e: DecodeError) -> redb::Error {
    redb::Error::Corrupted(format!("event page {first}: {}", e.0))
}

/// Up to `limit` events with `from <= seq < below`, ascending.
pub(crate) fn read_range(
    t: &impl ReadableTable<u64, &'static [u8]>,
    from: u64,
    below: u64,
    limit: usize,
) -> Result<Vec<(u64, String)>, redb::Error> {
    let mut out = Vec::new();
    if from >= below || limit == 0 {
        return Ok(out);
    }
    // The page holding `from` starts at or before it.
    let start = match t.range(..=from)?.next_back() {
        Some(r) => r?.0.value(),
        None => from,
    };
    for r in t.range(start..below)? {
        let (k, v) = r?;
        let first = k.value();
        for (seq, json) in decode_page(first, v.value()).map_err(|e| bad(first, e))? {
            if seq < from {
                continue;
            }
            if seq >= below || out.len() >= limit {
                return Ok(out);
            }
            out.push((seq, json.to_string()));
        }
    }
    Ok(out)
}

/// The newest events: the last `tail`, and every one from `floor` on; ascending.
pub(crate) fn read_tail(
    t: &impl ReadableTable<u64, &'static [u8]>,
    tail: usize,
    floor: u64,
) -> Result<Vec<(u64, String)>, redb::Error> {
    let mut pages: Vec<Vec<(u64, String)>> = Vec::new();
    let mut n = 0usize;
    for r in t.iter()?.rev() {
        let (k, v) = r?;
        let first = k.value();
        let events = decode_page(first, v.value()).map_err(|e| bad(first, e))?;
        let end = first + events.len() as u64;
        // Enough for the tail, and the whole page below the floor: nothing older is needed.
        if n >= tail && end <= floor {
            break;
        }
        n += events.len();
        pages.push(
            events
                .into_iter()
                .map(|(s, j)| (s, j.to_string()))
                .collect(),
        );
    }
    let mut out: Vec<(u64, String)> = pages.into_iter().rev().flatten().collect();
    let keep_from = out.len().saturating_sub(tail);
    let cut = out[..keep_from].partition_point(|(s, _)| *s < floor);
    out.drain(..cut);
    Ok(out)
}

/// Deletes the pages whose events all have `seq < below`.
pub(crate) fn trim(
    t: &mut redb::Table<'_, u64, &'static [u8]>,
    below: u64,
) -> Result<(), redb::Error> {
    let mut doomed = Vec::new();
    for r in t.range(..below)? {
        let (k, v) = r?;
        let first = k.value();
        let count = decode_page(first, v.value())
            .map_err(|e| bad(first, e))?
            .len() as u64;
        if first + count <= below {
            doomed.push(first);
        } else {
            break;
        }
    }
    for k in doomed {
        t.remove(k)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64) -> (u64, Arc<str>) {
        (seq, Arc::from(format!("{{\"seq\":{seq}}}")))
    }

    #[test]
    fn pages_round_trip_and_read_in_ranges_across_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(EVENT_PAGES).unwrap();
            // Pages of 3, 1 and 4 events: seqs 5..=12.
            for page in [
                vec![ev(5), ev(6), ev(7)],
                vec![ev(8)],
                (9..=12).map(ev).collect(),
            ] {
                t.insert(page[0].0, encode_page(&page).as_slice()).unwrap();
            }
            let seqs = |v: Vec<(u64, String)>| v.into_iter().map(|e| e.0).collect::<Vec<_>>();
            assert_eq!(
                seqs(read_range(&t, 6, 11, 100).unwrap()),
                vec![6, 7, 8, 9, 10]
            );
            assert_eq!(seqs(read_range(&t, 0, 100, 3).unwrap()), vec![5, 6, 7]);
            assert_eq!(seqs(read_range(&t, 12, 13, 3).unwrap()), vec![12]);
            assert!(read_range(&t, 13, 20, 3).unwrap().is_empty());
            let got = read_range(&t, 9, 10, 1).unwrap();
            assert_eq!(got, vec![(9, "{\"seq\":9}".to_string())]);
            assert_eq!(seqs(read_tail(&t, 2, u64::MAX).unwrap()), vec![11, 12]);
            assert_eq!(
                seqs(read_tail(&t, 2, 7).unwrap()),
                vec![7, 8, 9, 10, 11, 12]
            );
            assert_eq!(seqs(read_tail(&t, 100, u64::MAX).unwrap()).len(), 8);
            trim(&mut t, 9).unwrap();
            assert_eq!(
                seqs(read_range(&t, 0, 100, 100).unwrap()),
                (9..=12).collect::<Vec<_>>()
            );
            trim(&mut t, 11).unwrap();
            assert_eq!(
                seqs(read_range(&t, 0, 100, 100).unwrap()),
                (9..=12).collect::<Vec<_>>(),
                "a page straddling the trim point stays whole"
            );
        }
        txn.commit().unwrap();
        assert!(decode_page(1, &[2, 1, b'x']).is_err());
    }
}
