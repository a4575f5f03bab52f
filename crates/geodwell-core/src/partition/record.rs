//! A partition's input records and their one binary encoding, whichever log holds them (the
//! embedded journal and store of one process, or a cluster's input stream).
//!
//! A partition's engine is a pure function of the checkpoint it started from and its records
//! after it, in log order; so every input that changes what the engine does is a record:
//! - [`Input::Fixes`]: fixes, each with the watermark it was stamped with at ingest, applied in
//!   this order, after advancing to `w_before` when the record carries one (a log whose owner
//!   advances between records without writing a tick records the watermark it reached);
//! - [`Input::Tick`]: advance the watermark to `W`;
//! - [`Input::Fences`]: apply the fence changes up to fence position `c` (every change after the
//!   partition's own fence position, in order);
//! - [`Input::Removed`]: remove devices, outright (`DELETE /v1/devices/{id}`) or, with an idle
//!   TTL, those still idle when the record is applied.
//!
//! Layout (`uv` an unsigned LEB128 varint, `zz` a zigzag varint, `f64` little endian):
//!
//! ```text
//! u8  kind: 1 = fixes, 3 = tick, 4 = fences, 5 = removed (2: a fences record of an older
//!     single-process log, one change per record; read as kind 4)
//! fixes:   u8 has_w_before, [zz w_before], uv count, then per fix:
//!            uv len + UTF-8 device, zz ts, zz (stamp - ts), f64 lat, f64 lon,
//!            u8 has_accuracy, [f64 accuracy]
//! tick:    zz W
//! fences:  uv c
//! removed: u8 has_w_before, [zz w_before], zz idle_ttl_ms (0: unconditional), uv count,
//!            then per device: uv len + UTF-8 id
//! ```
//!
//! A fence change itself (the fence's text, or its deletion) is a [`FenceChange`]: `u8 1` and
//! the Feature text (put), or `u8 0` and the id (delete).
//!
//! Decoding refuses unknown kinds, truncated input, invalid UTF-8, invalid fixes and device ids,
//! and trailing bytes.

use std::sync::Arc;

use crate::codec::{DecodeError, Reader, put_f64, put_str, put_uv, put_zz};
use crate::fix::Fix;
use crate::time::{Dur, Ts};

/// One record of a partition's input.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Fixes with their ingest stamps, applied in this order after advancing to `w_before`.
    Fixes {
        /// The watermark the engine had reached before the record (`None`: not recorded).
        w_before: Option<Ts>,
        /// The fixes and their stamps.
        fixes: Vec<(Fix, Ts)>,
    },
    /// Advance the watermark to this.
    Tick(Ts),
    /// Apply the fence changes up to this fence position.
    Fences(u64),
    /// Remove devices.
    Removed(Removal),
}

/// Devices removed at one point of a partition's input.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// The engine's watermark just before (advanced to first).
    pub w_before: Option<Ts>,
    /// `Some(ttl)`: remove each only if still idle under this TTL; `None`: outright.
    pub idle: Option<Dur>,
    /// The device ids.
    pub ids: Vec<String>,
}

/// A fence change, as a fence log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceChange {
    /// Insert or replace: the normalized Feature text.
    Put(Arc<str>),
    /// Delete the fence with this id.
    Delete(String),
}

const KIND_FIXES: u8 = 1;
const KIND_FENCE_ONE: u8 = 2;
const KIND_TICK: u8 = 3;
const KIND_FENCES: u8 = 4;
const KIND_REMOVED: u8 = 5;

fn put_w(out: &mut Vec<u8>, w: Option<Ts>) {
    match w {
        Some(w) => {
            out.push(1);
            put_zz(out, w.0);
        }
        None => out.push(0),
    }
}

/// Encodes a record.
pub fn encode(input: &Input, out: &mut Vec<u8>) {
    match input {
        Input::Fixes { w_before, fixes } => encode_fixes(
            *w_before,
            fixes.len(),
            fixes.iter().map(|(f, s)| (f, *s)),
            out,
        ),
        Input::Tick(w) => {
            out.push(KIND_TICK);
            put_zz(out, w.0);
        }
        Input::Fences(c) => {
            out.push(KIND_FENCES);
            put_uv(out, *c);
        }
        Input::Removed(r) => {
            out.push(KIND_REMOVED);
            put_w(out, r.w_before);
            put_zz(out, r.idle.map_or(0, |d| d.0.max(1)));
            put_uv(out, r.ids.len() as u64);
            for id in &r.ids {
                put_str(out, id);
            }
        }
    }
}

/// The encoding of `input`.
pub fn to_bytes(input: &Input) -> Vec<u8> {
    let mut out = Vec::new();
    encode(input, &mut out);
    out
}

/// Encodes a fixes record from its parts, without building an [`Input`] first (ingest encodes
/// what it routes, on its own thread).
pub fn encode_fixes<'a>(
    w_before: Option<Ts>,
    n: usize,
    fixes: impl Iterator<Item = (&'a Fix, Ts)>,
    out: &mut Vec<u8>,
) {
    out.push(KIND_FIXES);
    put_w(out, w_before);
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

/// Decodes a record. Device ids are checked like any fix's, against `max_device_len`.
pub fn decode(bytes: &[u8], max_device_len: usize) -> Result<Input, DecodeError> {
    let mut r = Reader::new(bytes);
    let out = match r.u8()? {
        KIND_FIXES => decode_fixes(&mut r, max_device_len)?,
        KIND_FENCE_ONE | KIND_FENCES => Input::Fences(r.uv()?),
        KIND_TICK => Input::Tick(Ts(r.zz()?)),
        KIND_REMOVED => Input::Removed(decode_removal(&mut r, max_device_len)?),
        k => return Err(DecodeError(format!("unknown input record kind {k}"))),
    };
    r.end()?;
    Ok(out)
}

fn read_w(r: &mut Reader<'_>) -> Result<Option<Ts>, DecodeError> {
    Ok(if r.bool()? { Some(Ts(r.zz()?)) } else { None })
}

fn decode_fixes(r: &mut Reader<'_>, max_device_len: usize) -> Result<Input, DecodeError> {
    let w_before = read_w(r)?;
    let n = r.count()?;
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
    Ok(Input::Fixes { w_before, fixes })
}

fn decode_removal(r: &mut Reader<'_>, max_device_len: usize) -> Result<Removal, DecodeError> {
    let w_before = read_w(r)?;
    let ttl = r.zz()?;
    if ttl < 0 {
        return Err(r.err("negative idle TTL"));
    }
    let n = r.count()?;
    let mut ids = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let id = r.str()?;
        if id.is_empty() || id.len() > max_device_len {
            return Err(r.err("invalid device id"));
        }
        ids.push(id.to_string());
    }
    Ok(Removal {
        w_before,
        idle: (ttl > 0).then_some(Dur(ttl)),
        ids,
    })
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

    fn assert_round_trip_and_damage_refused(input: &Input) {
        let bytes = to_bytes(input);
        assert_eq!(&decode(&bytes, 128).unwrap(), input);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], 128).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, 128).is_err(), "trailing byte");
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
        for w_before in [None, Some(Ts(-5)), Some(Ts(1_767_225_600_000))] {
            let input = Input::Fixes {
                w_before,
                fixes: fixes.clone(),
            };
            assert_round_trip_and_damage_refused(&input);
            assert!(
                decode(&to_bytes(&input), 4).is_err(),
                "device ids are checked"
            );
        }
        assert_round_trip_and_damage_refused(&Input::Tick(Ts(-7)));
        assert_round_trip_and_damage_refused(&Input::Fences(u64::MAX));
        for r in [
            Removal {
                w_before: None,
                idle: None,
                ids: vec!["truck-17".into()],
            },
            Removal {
                w_before: Some(Ts(1_767_225_600_000)),
                idle: Some(Dur::from_secs(3600)),
                ids: vec!["a".into(), "ü".into(), "x".repeat(128)],
            },
        ] {
            assert_round_trip_and_damage_refused(&Input::Removed(r));
        }
        let long = to_bytes(&Input::Removed(Removal {
            w_before: None,
            idle: None,
            ids: vec!["x".repeat(129)],
        }));
        assert!(decode(&long, 128).is_err(), "removed ids are checked");
        assert!(decode(&[9], 128).is_err(), "unknown kind");
    }

    /// The records logs already hold keep their meaning: a single process's "fence change `n`
    /// applied" (kind 2) is the marker of fence position `n`, and the fixes record is the same
    /// bytes it always was.
    #[test]
    fn records_of_older_logs_still_read() {
        assert_eq!(decode(&[2, 0x87, 0x01], 128).unwrap(), Input::Fences(135));
        let bytes = to_bytes(&Input::Fixes {
            w_before: Some(Ts(5)),
            fixes: vec![(fix("d", 10, None), Ts(6))],
        });
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "01010a01016414070000000000c04a40cdcccccccccc23c000");
    }

    #[test]
    fn fence_changes_round_trip_and_damage_is_refused() {
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
