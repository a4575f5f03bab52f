//! The compact binary encodings every store shares: varints, a bounds-checked [`Reader`], and
//! the [`DeviceState`] record (a checkpoint's unit, whichever backend keeps it).
//!
//! Device record layout (the device id is the table key and is not repeated):
//!
//! ```text
//! u8      format tag (DEVICE_FORMAT = 2; 1 is read too)
//! u8      flags: bit 0 = last_applied present, bit 1 = last_position present,
//!         bit 2 = frontier present, bit 3 = hold_until present (bits 2 and 3: format 2 only)
//! [zz]    last_applied (Unix ms)                    if bit 0
//! [f64 f64] last_position (lat, lon), little endian if bit 1
//! [zz]    frontier (Unix ms)                        if bit 2
//! [zz]    hold_until (Unix ms)                      if bit 3
//! uv      buffer length, then per fix:
//!           zz ts, f64 lat, f64 lon, u8 has_accuracy, [f64 accuracy]
//! uv      pair count, then per pair:
//!           uv len + UTF-8 fence id, zz entered_at, zz (vote_first - entered_at),
//!           zz (vote_last - entered_at), u8 votes, u8 inside, u8 evaluated, uv fired, uv stale
//! ```
//!
//! `uv` is an unsigned LEB128 varint, `zz` a zigzag varint of an `i64` (differences use wrapping
//! arithmetic, so every `i64` round-trips). Decoding rejects unknown tags, truncated input,
//! out-of-range values, invalid UTF-8 and trailing bytes.
//!
//! Invariant: the encoding is a pure function of the fields of [`DeviceState`] and
//! [`PairState`]; both are destructured exhaustively here, so adding a field to either fails to
//! compile until this codec (and the stores' schema version, or the record's own format tag) is
//! updated. Each record carries its format tag: format 1 (before devices kept a frontier and a
//! delay hold) is still read, as a device without them (the engine restores its frontier as the
//! later of its last fix and the watermark); a build that knows only format 1 refuses a format-2
//! record by name instead of misreading it.

use crate::engine::DeviceState;
use crate::pairs::PairState;

/// Format tag of device records written by this version.
pub const DEVICE_FORMAT: u8 = 2;
/// The format before frontiers and delay holds, still read.
const DEVICE_FORMAT_1: u8 = 1;

/// Why a record did not decode: what was wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Appends `v` as an unsigned LEB128 varint.
pub fn put_uv(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` as a zigzag varint.
pub fn put_zz(out: &mut Vec<u8>, v: i64) {
    put_uv(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Appends `v` little endian.
pub fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `s` as a varint length and its UTF-8 bytes.
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_uv(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Appends the encoding of `d` (without its id) to `out`.
pub fn encode_device(d: &DeviceState, out: &mut Vec<u8>) {
    let DeviceState {
        id: _,
        last_applied,
        last_position,
        buffer,
        pairs,
        frontier,
        hold_until,
    } = d;
    out.push(DEVICE_FORMAT);
    out.push(
        u8::from(last_applied.is_some())
            | (u8::from(last_position.is_some()) << 1)
            | (u8::from(frontier.is_some()) << 2)
            | (u8::from(hold_until.is_some()) << 3),
    );
    if let Some(t) = last_applied {
        put_zz(out, *t);
    }
    if let Some((lat, lon)) = last_position {
        put_f64(out, *lat);
        put_f64(out, *lon);
    }
    for t in [frontier, hold_until].into_iter().flatten() {
        put_zz(out, *t);
    }
    put_uv(out, buffer.len() as u64);
    for &(ts, lat, lon, acc) in buffer {
        put_zz(out, ts);
        put_f64(out, lat);
        put_f64(out, lon);
        match acc {
            Some(a) => {
                out.push(1);
                put_f64(out, a);
            }
            None => out.push(0),
        }
    }
    put_uv(out, pairs.len() as u64);
    for (fence, p) in pairs {
        let PairState {
            entered_at,
            vote_first,
            vote_last,
            votes,
            inside,
            evaluated,
            fired,
            stale,
        } = p;
        put_str(out, fence);
        put_zz(out, *entered_at);
        put_zz(out, vote_first.wrapping_sub(*entered_at));
        put_zz(out, vote_last.wrapping_sub(*entered_at));
        out.push(*votes);
        out.push(u8::from(*inside));
        out.push(*evaluated);
        put_uv(out, u64::from(*fired));
        put_uv(out, u64::from(*stale));
    }
}

/// A cursor over an encoded record: every read is bounds-checked.
pub struct Reader<'a> {
    /// The record.
    pub b: &'a [u8],
    /// The next byte to read.
    pub at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `b`.
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }

    /// Refuses bytes after the end of what was read.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(self.err("trailing bytes"))
        }
    }

    /// An error naming `what` and the position.
    pub fn err(&self, what: &str) -> DecodeError {
        DecodeError(format!("{what} at byte {}", self.at))
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let v = *self.b.get(self.at).ok_or_else(|| self.err("truncated"))?;
        self.at += 1;
        Ok(v)
    }

    /// An unsigned varint.
    pub fn uv(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.err("varint overflow"));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint too long"))
    }

    /// A zigzag varint.
    pub fn zz(&mut self) -> Result<i64, DecodeError> {
        let u = self.uv()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    /// A little-endian `f64`.
    pub fn f64(&mut self) -> Result<f64, DecodeError> {
        self.eight("truncated f64").map(f64::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub fn u64_le(&mut self) -> Result<u64, DecodeError> {
        self.eight("truncated u64").map(u64::from_le_bytes)
    }

    /// The next 8 bytes (`what` names them when they are missing).
    fn eight(&mut self, what: &str) -> Result<[u8; 8], DecodeError> {
        let end = self.at + 8;
        let bytes = self.b.get(self.at..end).ok_or_else(|| self.err(what))?;
        self.at = end;
        Ok(bytes.try_into().expect("8 bytes"))
    }

    /// A length no longer than the bytes left (each element takes one at least).
    pub fn count(&mut self) -> Result<usize, DecodeError> {
        let n = self.uv()?;
        // Every element takes at least one byte: a longer length is corrupt, and checking it
        // here keeps a corrupt length from reserving absurd amounts of memory.
        if n > (self.b.len() - self.at) as u64 {
            return Err(self.err("length beyond the end of the record"));
        }
        Ok(n as usize)
    }

    /// A length-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.count()?;
        let bytes = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(bytes)
    }

    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.count()?;
        let bytes = &self.b[self.at..self.at + n];
        let s = std::str::from_utf8(bytes).map_err(|_| self.err("invalid UTF-8"))?;
        self.at += n;
        Ok(s)
    }

    /// A byte that is 0 or 1.
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.err("invalid bool")),
        }
    }

    /// A varint that fits a `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        u16::try_from(self.uv()?).map_err(|_| self.err("u16 out of range"))
    }
}

/// Decodes a device record stored under `id`.
pub fn decode_device(id: &str, bytes: &[u8]) -> Result<DeviceState, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let tag = r.u8()?;
    let known_flags = match tag {
        DEVICE_FORMAT => 0b1111,
        DEVICE_FORMAT_1 => 0b11,
        _ => {
            return Err(DecodeError(format!(
                "unknown device record format {tag} (this build writes {DEVICE_FORMAT})"
            )));
        }
    };
    let flags = r.u8()?;
    if flags & !known_flags != 0 {
        return Err(r.err("unknown flags"));
    }
    let last_applied = if flags & 1 != 0 { Some(r.zz()?) } else { None };
    let last_position = if flags & 2 != 0 {
        Some((r.f64()?, r.f64()?))
    } else {
        None
    };
    let frontier = if flags & 4 != 0 { Some(r.zz()?) } else { None };
    let hold_until = if flags & 8 != 0 { Some(r.zz()?) } else { None };
    let n = r.count()?;
    let mut buffer = Vec::with_capacity(n);
    for _ in 0..n {
        let ts = r.zz()?;
        let lat = r.f64()?;
        let lon = r.f64()?;
        let acc = if r.bool()? { Some(r.f64()?) } else { None };
        buffer.push((ts, lat, lon, acc));
    }
    let n = r.count()?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        let fence = r.str()?.to_string();
        let entered_at = r.zz()?;
        let vote_first = entered_at.wrapping_add(r.zz()?);
        let vote_last = entered_at.wrapping_add(r.zz()?);
        let votes = r.u8()?;
        let inside = r.bool()?;
        let evaluated = r.u8()?;
        let fired = r.u16()?;
        let stale = r.u16()?;
        pairs.push((
            fence,
            PairState {
                entered_at,
                vote_first,
                vote_last,
                votes,
                inside,
                evaluated,
                fired,
                stale,
            },
        ));
    }
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(DeviceState {
        id: id.to_string(),
        last_applied,
        last_position,
        buffer,
        pairs,
        frontier,
        hold_until,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DeviceState {
        DeviceState {
            id: "truck-17".into(),
            last_applied: Some(1_767_225_600_000),
            last_position: Some((50.005, 10.005)),
            buffer: vec![
                (1_767_225_601_000, 50.0, 10.0, None),
                (1_767_225_602_000, -1.5, 179.9, Some(12.5)),
            ],
            frontier: Some(1_767_225_600_500),
            hold_until: Some(1_767_225_700_000),
            pairs: vec![
                (
                    "depot-3".into(),
                    PairState {
                        entered_at: 1_767_225_000_000,
                        vote_first: 1_767_225_500_000,
                        vote_last: 1_767_225_600_000,
                        votes: 2,
                        inside: true,
                        evaluated: 3,
                        fired: 0b101,
                        stale: 0b010,
                    },
                ),
                (
                    "x".into(),
                    PairState {
                        entered_at: i64::MIN,
                        vote_first: i64::MAX,
                        vote_last: 0,
                        votes: 255,
                        inside: false,
                        evaluated: 0,
                        fired: u16::MAX,
                        stale: 0,
                    },
                ),
            ],
        }
    }

    #[test]
    fn device_records_round_trip_and_reject_damage() {
        let d = sample();
        let mut buf = Vec::new();
        encode_device(&d, &mut buf);
        assert_eq!(decode_device("truck-17", &buf).unwrap(), d);
        let empty = DeviceState {
            id: "e".into(),
            last_applied: None,
            last_position: None,
            buffer: vec![],
            pairs: vec![],
            frontier: None,
            hold_until: None,
        };
        let mut b2 = Vec::new();
        encode_device(&empty, &mut b2);
        assert_eq!(b2, vec![DEVICE_FORMAT, 0, 0, 0]);
        assert_eq!(decode_device("e", &b2).unwrap(), empty);
        // Every truncation fails, and so do a trailing byte and a wrong tag.
        for n in 0..buf.len() {
            assert!(decode_device("t", &buf[..n]).is_err(), "prefix {n}");
        }
        let mut long = buf.clone();
        long.push(0);
        assert!(decode_device("t", &long).is_err());
        let mut tag = buf.clone();
        tag[0] = 9;
        assert!(decode_device("t", &tag).is_err());
    }

    /// The bytes of `sample()` (without frontier and hold) in format 1, as stores written before
    /// frontiers were kept hold them.
    const FORMAT_1_SAMPLE: &str = "010380a0d5edee66713d0ad7a3004940c3f5285c8f02244002d0afd5edee66000000000000494000000000\
         0000244000a0bfd5edee66000000000000f8bfcdcccccccc7c664001000000000000294002076465706f\
         742d3380818cedee66c0843d809f4902010305020178ffffffffffffffffff0101ffffffffffffffffff\
         01ff0000ffff0300";

    /// Pins the byte format: if this fails, the stored format changed, and the stores' schema
    /// version (or [`DEVICE_FORMAT`]) must change with it.
    #[test]
    fn device_format_is_pinned() {
        let mut buf = Vec::new();
        encode_device(&sample(), &mut buf);
        let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "020f80a0d5edee66713d0ad7a3004940c3f5285c8f022440e8a7d5edee66c0bae1edee6602d0afd5edee66\
             0000000000004940000000000000244000a0bfd5edee66000000000000f8bfcdcccccccc7c664001000000\
             000000294002076465706f742d3380818cedee66c0843d809f4902010305020178ffffffffffffffffff01\
             01ffffffffffffffffff01ff0000ffff0300",
            "the device record encoding changed: bump SCHEMA_VERSION (and DEVICE_FORMAT)"
        );
    }

    /// A record of format 1 still reads, as the same device without frontier or hold.
    #[test]
    fn format_1_records_still_read() {
        let bytes: Vec<u8> = (0..FORMAT_1_SAMPLE.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FORMAT_1_SAMPLE[i..i + 2], 16).unwrap())
            .collect();
        let want = DeviceState {
            frontier: None,
            hold_until: None,
            ..sample()
        };
        assert_eq!(decode_device("truck-17", &bytes).unwrap(), want);
        // Format 1 knows no frontier flag.
        let mut flagged = bytes.clone();
        flagged[1] |= 4;
        assert!(decode_device("truck-17", &flagged).is_err());
    }
}
