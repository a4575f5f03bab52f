//! The input log's records and their binary encoding (pure).
//!
//! Each shard numbers the steps that change its engine (`seq`, from 1, gap-free): a batch of
//! fixes, the application of a fence change, or the removal of devices. Its engine is a pure function of the checkpoint
//! it started from and its records in `seq` order, so replaying them through the same engine
//! gives the same state and the same events, ids included. A fence change itself (the fence's
//! text, or its deletion) is one [`FenceChange`] for all shards, numbered in the order the
//! registry made the changes; each shard's record names the change it applied where.
//!
//! Record layout (`uv` an unsigned LEB128 varint, `zz` a zigzag varint, `f64` little endian):
//!
//! ```text
//! u8  kind: 1 = fixes, 2 = fence change applied, 5 = devices removed
//! fixes:   u8 has_w_before, [zz w_before], uv count, then per fix:
//!            uv len + UTF-8 device, zz ts, zz (stamp - ts), f64 lat, f64 lon,
//!            u8 has_accuracy, [f64 accuracy]
//! fence:   uv change number
//! removed: u8 has_w_before, [zz w_before], zz idle_ttl_ms (0: unconditional), uv count,
//!            then per device: uv len + UTF-8 id
//! ```
//!
//! A removal with an idle TTL removes each device only if it is still idle under that TTL at
//! that point (a cluster's owner decides expiry before the record comes back through its input);
//! without one it removes them outright (`DELETE /v1/devices/{id}`, or expiry decided and
//! applied in the same step).
//!
//! A fence change: `u8 1` and the Feature text (put), or `u8 0` and the id (delete).
//! Decoding refuses unknown kinds, truncated input, invalid UTF-8, invalid fixes and trailing
//! bytes.

use std::sync::Arc;

use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

use super::codec::{DecodeError, Reader, put_f64, put_str, put_uv, put_zz};

/// One step of a shard's engine, as the log holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardInput {
    /// A batch of fixes, applied in this order: the engine's watermark just before (`None`
    /// before the first), then each fix with the watermark it arrived under.
    Fixes {
        /// The engine's watermark before the batch.
        w_before: Option<Ts>,
        /// The fixes and their stamps.
        fixes: Vec<(Fix, Ts)>,
    },
    /// Fence change number `n` applied at this point.
    Fence(u64),
    /// Devices removed at this point (kind 5).
    Removed(Removal),
}

/// Devices removed at one point of a shard's (or partition's) input.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// The engine's watermark just before (advanced to first on replay).
    pub w_before: Option<Ts>,
    /// `Some(ttl)`: remove each only if still idle under this TTL; `None`: outright.
    pub idle: Option<geodwell_core::time::Dur>,
    /// The device ids.
    pub ids: Vec<String>,
}

/// A fence change, shared by every shard's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceChange {
    /// Insert or replace: the normalized Feature text.
    Put(Arc<str>),
    /// Delete the fence with this id.
    Delete(String),
}

const KIND_FIXES: u8 = 1;
const KIND_FENCE: u8 = 2;
const KIND_REMOVED: u8 = 5;

/// Encodes a removal record.
pub fn encode_removal(r: &Removal, out: &mut Vec<u8>) {
    out.push(KIND_REMOVED);
    match r.w_before {
        Some(w) => {
            out.push(1);
            put_zz(out, w.0);
        }
        None => out.push(0),
    }
    put_zz(out, r.idle.map_or(0, |d| d.0.max(1)));
    put_uv(out, r.ids.len() as u64);
    for id in &r.ids {
        put_str(out, id);
    }
}

/// Encodes a batch record from its parts, without building a [`ShardInput`] first (the shard
/// encodes what it applies, on its own thread).
pub fn encode_fixes<'a>(
    w_before: Option<Ts>,
    n: usize,
    fixes: impl Iterator<Item = (&'a Fix, Ts)>,
    out: &mut Vec<u8>,
) {
    out.push(KIND_FIXES);
    match w_before {
        Some(w) => {
            out.push(1);
            put_zz(out, w.0);
        }
        None => out.push(0),
    }
    put_uv(out, n as u64);
    for (f, stamp) in fixes {
        put_str(out, &f.device);
        put_zz(out, f.ts.0);
        put_zz(out, stamp.0.wrapping_sub(f.ts.0));
        put_f64(out, f.lat);
        put_f64(out, f.lon);
        match f.accuracy {
            Some(a) => {
                out.push(1);
                put_f64(out, a);
            }
            None => out.push(0),
        }
    }
}

/// Encodes a "fence change applied" record.
pub fn encode_fence_applied(n: u64, out: &mut Vec<u8>) {
    out.push(KIND_FENCE);
    put_uv(out, n);
}

/// Decodes a shard record. Device ids are checked like any fix's, against `max_device_len`.
pub fn decode_shard_input(bytes: &[u8], max_device_len: usize) -> Result<ShardInput, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let out = match r.u8()? {
        KIND_FIXES => {
            let w_before = if r.bool()? { Some(Ts(r.zz()?)) } else { None };
            let n = r.len()?;
            let mut fixes = Vec::with_capacity(n);
            for _ in 0..n {
                let device = r.str()?;
                let ts = r.zz()?;
                let stamp = ts.wrapping_add(r.zz()?);
                let lat = r.f64()?;
                let lon = r.f64()?;
                let accuracy = if r.bool()? { Some(r.f64()?) } else { None };
                let fix = Fix::new(device, Ts(ts), lat, lon, accuracy, max_device_len)
                    .map_err(|e| r.err(&format!("invalid fix ({e})")))?;
                fixes.push((fix, Ts(stamp)));
            }
            ShardInput::Fixes { w_before, fixes }
        }
        KIND_FENCE => ShardInput::Fence(r.uv()?),
        KIND_REMOVED => {
            let w_before = if r.bool()? { Some(Ts(r.zz()?)) } else { None };
            let ttl = r.zz()?;
            if ttl < 0 {
                return Err(r.err("negative idle TTL"));
            }
            let n = r.len()?;
            let mut ids = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let id = r.str()?;
                if id.is_empty() || id.len() > max_device_len {
                    return Err(r.err("invalid device id"));
                }
                ids.push(id.to_string());
            }
            ShardInput::Removed(Removal {
                w_before,
                idle: (ttl > 0).then_some(geodwell_core::time::Dur(ttl)),
                ids,
            })
        }
        k => return Err(DecodeError(format!("unknown input record kind {k}"))),
    };
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(out)
}

/// Encodes a fence change.
pub fn encode_fence_change(c: &FenceChange, out: &mut Vec<u8>) {
    match c {
        FenceChange::Put(text) => {
            out.push(1);
            out.extend_from_slice(text.as_bytes());
        }
        FenceChange::Delete(id) => {
            out.push(0);
            out.extend_from_slice(id.as_bytes());
        }
    }
}

/// Decodes a fence change.
pub fn decode_fence_change(bytes: &[u8]) -> Result<FenceChange, DecodeError> {
    let (tag, rest) = bytes
        .split_first()
        .ok_or_else(|| DecodeError("empty fence change".into()))?;
    let text =
        std::str::from_utf8(rest).map_err(|_| DecodeError("fence change is not UTF-8".into()))?;
    match tag {
        1 => Ok(FenceChange::Put(Arc::from(text))),
        0 => Ok(FenceChange::Delete(text.to_string())),
        t => Err(DecodeError(format!("unknown fence change tag {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(d: &str, ts: i64, acc: Option<f64>) -> Fix {
        Fix::new(d, Ts(ts), 53.5, -9.9, acc, 128).unwrap()
    }

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let fixes = vec![
            (
                fix("truck-17", 1_767_225_600_000, Some(8.0)),
                Ts(1_767_225_599_000),
            ),
            (fix("ü", 0, None), Ts(i64::MIN + 5)),
            (fix("x", 253_402_300_799_999, None), Ts(253_402_300_799_999)),
        ];
        for w in [None, Some(Ts(-5)), Some(Ts(1_767_225_600_000))] {
            let mut out = Vec::new();
            encode_fixes(w, fixes.len(), fixes.iter().map(|(f, s)| (f, *s)), &mut out);
            let back = decode_shard_input(&out, 128).unwrap();
            assert_eq!(
                back,
                ShardInput::Fixes {
                    w_before: w,
                    fixes: fixes.clone()
                }
            );
            for cut in 0..out.len() {
                assert!(
                    decode_shard_input(&out[..cut], 128).is_err(),
                    "cut at {cut}"
                );
            }
            let mut longer = out.clone();
            longer.push(0);
            assert!(decode_shard_input(&longer, 128).is_err());
            assert!(
                decode_shard_input(&out, 4).is_err(),
                "device ids are checked"
            );
        }
        let mut out = Vec::new();
        encode_fence_applied(u64::MAX, &mut out);
        assert_eq!(
            decode_shard_input(&out, 128).unwrap(),
            ShardInput::Fence(u64::MAX)
        );
        assert!(decode_shard_input(&[9], 128).is_err());
        for r in [
            Removal {
                w_before: None,
                idle: None,
                ids: vec!["truck-17".into()],
            },
            Removal {
                w_before: Some(Ts(1_767_225_600_000)),
                idle: Some(geodwell_core::time::Dur::from_secs(3600)),
                ids: vec!["a".into(), "ü".into(), "x".repeat(128)],
            },
        ] {
            let mut out = Vec::new();
            encode_removal(&r, &mut out);
            assert_eq!(
                decode_shard_input(&out, 128).unwrap(),
                ShardInput::Removed(r.clone())
            );
            for cut in 0..out.len() {
                assert!(
                    decode_shard_input(&out[..cut], 128).is_err(),
                    "cut at {cut}"
                );
            }
            assert!(decode_shard_input(&[&out[..], &[0]].concat(), 128).is_err());
        }
        let mut long = Vec::new();
        encode_removal(
            &Removal {
                w_before: None,
                idle: None,
                ids: vec!["x".repeat(129)],
            },
            &mut long,
        );
        assert!(decode_shard_input(&long, 128).is_err(), "ids are checked");
        for c in [
            FenceChange::Put(Arc::from("{\"type\":\"Feature\"}")),
            FenceChange::Delete("depot-3".into()),
        ] {
            let mut out = Vec::new();
            encode_fence_change(&c, &mut out);
            assert_eq!(decode_fence_change(&out).unwrap(), c);
        }
        assert!(decode_fence_change(&[]).is_err());
        assert!(decode_fence_change(&[2, b'x']).is_err());
    }
}
