//! A partition's input records and the cluster's fence change messages, and their binary
//! encoding (pure).
//!
//! A partition's engine is a pure function of its checkpoint and the records after it on its
//! subject, in stream order; so every input that changes what the engine does is a record:
//! - [`PartitionInput::Fixes`]: fixes, each with the watermark it was stamped with at ingest
//!   (the same layout as the embedded log's batch record, without a watermark before it: in a
//!   cluster every advance is its own record);
//! - [`PartitionInput::Tick`]: advance the watermark to `W` (written by the partition's owner:
//!   in `live` mode from its wall clock, in `event` mode from the cluster's watermark);
//! - [`PartitionInput::Fences`]: apply the cluster's fence changes up to fence stream sequence
//!   `c` (written by whoever changed a fence, so the change reaches every partition at a
//!   definite point of its input);
//! - [`PartitionInput::Removed`]: remove devices (the embedded log's removal record: written by
//!   `DELETE /v1/devices/{id}` on any node, outright, or by the owner's idle sweep, with the idle
//!   TTL so that a device that got a fix in between is kept).
//!
//! ```text
//! u8 kind: 1 = fixes, 5 = removed (see store::input), 3 = tick, 4 = fences
//! tick:   zz W
//! fences: uv c
//! ```
//!
//! A fence change message on [`crate::cluster::nats::FENCES_SUBJECT`] holds one write (all or
//! nothing): `uv count`, then per change `uv len` and the change (`store::input`'s encoding).
//! Decoding refuses unknown kinds, truncated input and trailing bytes.

use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

use crate::store::codec::{DecodeError, Reader, put_uv, put_zz};
use crate::store::input::{
    FenceChange, ShardInput, decode_fence_change, decode_shard_input, encode_fence_change,
    encode_fixes,
};

/// One record of a partition's input.
#[derive(Debug, Clone, PartialEq)]
pub enum PartitionInput {
    /// Fixes with their ingest stamps, applied in this order.
    Fixes(Vec<(Fix, Ts)>),
    /// Advance the watermark to this.
    Tick(Ts),
    /// Apply the cluster's fence changes up to this fence stream sequence.
    Fences(u64),
    /// Remove devices.
    Removed(crate::store::input::Removal),
}

const KIND_FIXES: u8 = 1;
const KIND_TICK: u8 = 3;
const KIND_FENCES: u8 = 4;
const KIND_REMOVED: u8 = 5;

/// Encodes a fixes record.
pub fn encode_fix_record<'a>(
    n: usize,
    fixes: impl Iterator<Item = (&'a Fix, Ts)>,
    out: &mut Vec<u8>,
) {
    encode_fixes(None, n, fixes, out);
}

/// Encodes a tick record.
pub fn encode_tick(w: Ts) -> Vec<u8> {
    let mut out = Vec::with_capacity(11);
    out.push(KIND_TICK);
    put_zz(&mut out, w.0);
    out
}

/// Encodes a fences record.
pub fn encode_fences(c: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(11);
    out.push(KIND_FENCES);
    put_uv(&mut out, c);
    out
}

/// Decodes a partition record; device ids are checked against `max_device_len`.
pub fn decode_record(bytes: &[u8], max_device_len: usize) -> Result<PartitionInput, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let kind = r.u8()?;
    let out = match kind {
        KIND_FIXES | KIND_REMOVED => {
            return match decode_shard_input(bytes, max_device_len)? {
                ShardInput::Removed(r) => Ok(PartitionInput::Removed(r)),
                ShardInput::Fixes {
                    w_before: None,
                    fixes,
                } => Ok(PartitionInput::Fixes(fixes)),
                _ => Err(DecodeError(
                    "a partition's fixes record carries no watermark before it".into(),
                )),
            };
        }
        KIND_TICK => PartitionInput::Tick(Ts(r.zz()?)),
        KIND_FENCES => PartitionInput::Fences(r.uv()?),
        k => return Err(DecodeError(format!("unknown partition record kind {k}"))),
    };
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(out)
}

/// Encodes one fence write (its changes, in order).
pub fn encode_fence_write(changes: &[FenceChange]) -> Vec<u8> {
    let mut out = Vec::new();
    put_uv(&mut out, changes.len() as u64);
    let mut one = Vec::new();
    for c in changes {
        one.clear();
        encode_fence_change(c, &mut one);
        put_uv(&mut out, one.len() as u64);
        out.extend_from_slice(&one);
    }
    out
}

/// Decodes one fence write.
pub fn decode_fence_write(bytes: &[u8]) -> Result<Vec<FenceChange>, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let n = r.len()?;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = r.len()?;
        let end =
            r.at.checked_add(len)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| r.err("truncated fence change"))?;
        out.push(decode_fence_change(&bytes[r.at..end])?);
        r.at = end;
    }
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let f = Fix::new(
            "truck-17",
            Ts(1_767_225_600_000),
            53.5,
            -9.9,
            Some(8.0),
            128,
        )
        .unwrap();
        let mut fixes = Vec::new();
        encode_fix_record(1, [(&f, Ts(1_767_225_598_000))].into_iter(), &mut fixes);
        let cases = [
            (
                fixes.clone(),
                PartitionInput::Fixes(vec![(f.clone(), Ts(1_767_225_598_000))]),
            ),
            (encode_tick(Ts(-7)), PartitionInput::Tick(Ts(-7))),
            (encode_fences(u64::MAX), PartitionInput::Fences(u64::MAX)),
        ];
        for (bytes, want) in cases {
            assert_eq!(decode_record(&bytes, 128).unwrap(), want);
            for cut in 0..bytes.len() {
                assert!(decode_record(&bytes[..cut], 128).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode_record(&longer, 128).is_err(), "trailing byte");
        }
        assert!(decode_record(&[9], 128).is_err(), "unknown kind");
        // The embedded log's record with a watermark before it is not a partition record.
        let mut embedded = Vec::new();
        encode_fixes(Some(Ts(5)), 1, [(&f, Ts(6))].into_iter(), &mut embedded);
        assert!(decode_record(&embedded, 128).is_err());
        assert!(
            decode_record(&fixes, 4).is_err(),
            "device id longer than allowed"
        );
    }

    #[test]
    fn fence_writes_round_trip_and_damage_is_refused() {
        let changes = vec![
            FenceChange::Put(Arc::from("{\"type\":\"Feature\"}")),
            FenceChange::Delete("depot-3".into()),
            FenceChange::Delete(String::new()),
        ];
        let bytes = encode_fence_write(&changes);
        assert_eq!(decode_fence_write(&bytes).unwrap(), changes);
        for cut in 0..bytes.len() {
            assert!(decode_fence_write(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(1);
        assert!(decode_fence_write(&longer).is_err());
        assert_eq!(
            decode_fence_write(&encode_fence_write(&[])).unwrap(),
            vec![]
        );
    }
}
