//! The fix outcomes a partition's owner sends back to the node that ingested a part (on
//! `geodwell.out.<node>`, named by the part's reply header), and their encoding.
//!
//! Invariant: one outcome per fix of the part, in the part's order; decoding refuses unknown
//! codes, truncated input and trailing bytes.

use std::sync::Arc;

use geodwell_core::codec::{DecodeError, Reader, put_uv};
use geodwell_core::engine::{IngestError, Ingested, LateReason};

/// How the owner took one fix, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted.
    Accepted,
    /// Late, for the reason given.
    Late(LateReason),
    /// Duplicate.
    Duplicate,
    /// Refused: the partition holds as many devices as it may.
    TooManyDevices,
    /// Refused: the device's buffer is full (`max` fixes).
    BufferFull(u64),
}

impl Outcome {
    pub(crate) fn of(r: &Result<Ingested, IngestError>) -> Outcome {
        match r {
            Ok(Ingested::Accepted) => Outcome::Accepted,
            Ok(Ingested::Late(r)) => Outcome::Late(*r),
            Ok(Ingested::Duplicate) => Outcome::Duplicate,
            Err(IngestError::TooManyDevices { .. }) => Outcome::TooManyDevices,
            Err(IngestError::BufferFull { max, .. }) => Outcome::BufferFull(*max as u64),
        }
    }

    pub(crate) fn into_result(self, device: &str) -> Result<Ingested, IngestError> {
        match self {
            Outcome::Accepted => Ok(Ingested::Accepted),
            Outcome::Late(r) => Ok(Ingested::Late(r)),
            Outcome::Duplicate => Ok(Ingested::Duplicate),
            Outcome::TooManyDevices => Err(IngestError::TooManyDevices {
                device: Arc::from(device),
            }),
            Outcome::BufferFull(max) => Err(IngestError::BufferFull {
                device: Arc::from(device),
                max: max as usize,
            }),
        }
    }
}

/// Encodes a part's outcomes: `uv req`, `uv n`, then per fix a code (0 accepted, 1 late as too
/// old, 2 duplicate, 3 too many devices, 4 buffer full + `uv max`, 5 late as behind its
/// device).
pub fn encode_outcomes(req: u64, outcomes: &[Result<Ingested, IngestError>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + outcomes.len());
    put_uv(&mut out, req);
    put_uv(&mut out, outcomes.len() as u64);
    for o in outcomes {
        match Outcome::of(o) {
            Outcome::Accepted => out.push(0),
            Outcome::Late(LateReason::TooOld) => out.push(1),
            Outcome::Late(LateReason::BehindDevice) => out.push(5),
            Outcome::Duplicate => out.push(2),
            Outcome::TooManyDevices => out.push(3),
            Outcome::BufferFull(max) => {
                out.push(4);
                put_uv(&mut out, max);
            }
        }
    }
    out
}

/// Decodes [`encode_outcomes`].
pub fn decode_outcomes(b: &[u8]) -> Result<(u64, Vec<Outcome>), DecodeError> {
    let mut r = Reader { b, at: 0 };
    let req = r.uv()?;
    let n = r.count()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(match r.u8()? {
            0 => Outcome::Accepted,
            1 => Outcome::Late(LateReason::TooOld),
            5 => Outcome::Late(LateReason::BehindDevice),
            2 => Outcome::Duplicate,
            3 => Outcome::TooManyDevices,
            4 => Outcome::BufferFull(r.uv()?),
            c => return Err(DecodeError(format!("unknown outcome {c}"))),
        });
    }
    if r.at != b.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok((req, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip() {
        let d: Arc<str> = Arc::from("d");
        let all = vec![
            Ok(Ingested::Accepted),
            Ok(Ingested::Late(LateReason::TooOld)),
            Ok(Ingested::Late(LateReason::BehindDevice)),
            Ok(Ingested::Duplicate),
            Err(IngestError::TooManyDevices { device: d.clone() }),
            Err(IngestError::BufferFull {
                device: d.clone(),
                max: 300,
            }),
        ];
        let (req, back) = decode_outcomes(&encode_outcomes(77, &all)).unwrap();
        assert_eq!(req, 77);
        let back: Vec<_> = back.into_iter().map(|o| o.into_result(&d)).collect();
        assert_eq!(back, all);
        assert!(decode_outcomes(&[1, 1, 9]).is_err());
        assert!(decode_outcomes(&[1, 2, 0]).is_err(), "truncated");
    }
}
