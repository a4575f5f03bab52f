//! Location fixes and their validation.
//!
//! A [`Fix`] that exists is valid: finite coordinates in range, a non-empty device id within the
//! length limit, an event time inside [`Ts::MIN`]..=[`Ts::MAX`], a finite non-negative accuracy.
//! Transport parsing (JSON, NDJSON, tracker protocols) lives in the shell and ends in
//! [`Fix::new`], so every transport validates the same way.

use compact_str::CompactString;
use std::cmp::Ordering;

use thiserror::Error;

use crate::time::Ts;

/// Default longest device id, in bytes.
pub const DEFAULT_MAX_DEVICE_LEN: usize = 128;

/// One validated position report.
#[derive(Debug, Clone, PartialEq)]
pub struct Fix {
    /// Device id. Inline up to 24 bytes, so that a fix of a usual id costs no heap block of its
    /// own (an `Arc<str>` was one allocation per fix on the ingest path).
    pub device: CompactString,
    /// Event time.
    pub ts: Ts,
    /// Latitude, degrees, -90..=90.
    pub lat: f64,
    /// Longitude, degrees, -180..=180.
    pub lon: f64,
    /// Horizontal accuracy radius in metres, if reported.
    pub accuracy: Option<f64>,
}

/// Why a fix was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FixError {
    /// The device id is empty.
    #[error("device must be a non-empty string")]
    EmptyDevice,
    /// The device id is longer than allowed.
    #[error("device id is {len} bytes, longer than the limit of {max}")]
    DeviceTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The device id contains control characters.
    #[error("device id contains control characters")]
    DeviceControlChars,
    /// Latitude not finite or outside -90..=90.
    #[error("lat must be a finite number in -90..=90, got {0}")]
    BadLat(f64),
    /// Longitude not finite or outside -180..=180.
    #[error("lon must be a finite number in -180..=180, got {0}")]
    BadLon(f64),
    /// Accuracy not finite or negative.
    #[error("accuracy must be a finite number >= 0, got {0}")]
    BadAccuracy(f64),
}

/// The first character of an id that a message broker cannot carry in a topic or subject, if
/// any: a control character (U+0000-U+001F, U+007F-U+009F) or a Unicode noncharacter
/// (U+FDD0-U+FDEF and the last two code points of every plane, U+FFFE, U+FFFF, ..., U+10FFFF).
/// MQTT brokers refuse both in topic names (MQTT 3.1.1 section 1.5.3, MQTT 5 section 1.5.4) and
/// drop the connection that sends them. New device and fence ids are held to it; ids already
/// stored are not, so state written before stays readable.
pub fn uncarriable_char(id: &str) -> Option<char> {
    id.chars().find(|&c| uncarriable(c))
}

/// Whether a broker cannot carry `c` in a topic (see [`uncarriable_char`]).
pub fn uncarriable(c: char) -> bool {
    let n = c as u32;
    c.is_control() || (0xFDD0..=0xFDEF).contains(&n) || (n & 0xFFFE) == 0xFFFE
}

impl Fix {
    /// Validates and builds a fix.
    pub fn new(
        device: &str,
        ts: Ts,
        lat: f64,
        lon: f64,
        accuracy: Option<f64>,
        max_device_len: usize,
    ) -> Result<Fix, FixError> {
        if device.is_empty() {
            return Err(FixError::EmptyDevice);
        }
        if device.len() > max_device_len {
            return Err(FixError::DeviceTooLong {
                len: device.len(),
                max: max_device_len,
            });
        }
        if device.chars().any(char::is_control) {
            return Err(FixError::DeviceControlChars);
        }
        if !(lat.is_finite() && (-90.0..=90.0).contains(&lat)) {
            return Err(FixError::BadLat(lat));
        }
        if !(lon.is_finite() && (-180.0..=180.0).contains(&lon)) {
            return Err(FixError::BadLon(lon));
        }
        if let Some(a) = accuracy
            && !(a.is_finite() && a >= 0.0)
        {
            return Err(FixError::BadAccuracy(a));
        }
        Ok(Fix {
            device: CompactString::from(device),
            ts,
            lat,
            lon,
            accuracy,
        })
    }

    /// The application order of fixes of one device: (ts, lat, lon).
    pub fn order(&self, other: &Fix) -> Ordering {
        self.ts
            .cmp(&other.ts)
            .then(self.lat.total_cmp(&other.lat))
            .then(self.lon.total_cmp(&other.lon))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_bad_field() {
        let ok =
            |d: &str, lat: f64, lon: f64, acc: Option<f64>| Fix::new(d, Ts(0), lat, lon, acc, 8);
        assert!(ok("a", 1.0, 2.0, Some(5.0)).is_ok());
        assert_eq!(ok("", 0.0, 0.0, None), Err(FixError::EmptyDevice));
        assert!(matches!(
            ok("123456789", 0.0, 0.0, None),
            Err(FixError::DeviceTooLong { len: 9, max: 8 })
        ));
        assert_eq!(ok("a\n", 0.0, 0.0, None), Err(FixError::DeviceControlChars));
        for bad in [
            "a\u{ffff}",
            "\u{fffe}",
            "x\u{10ffff}",
            "\u{fdd0}",
            "\u{1fffe}",
            "a\u{85}",
        ] {
            assert!(uncarriable_char(bad).is_some(), "{bad:?}");
        }
        for good in [
            "truck-17",
            "jane/phone",
            "caf\u{e9}",
            "\u{1f69a}",
            "\u{fffd}",
            "a b",
        ] {
            assert_eq!(uncarriable_char(good), None, "{good:?}");
        }
        assert!(matches!(
            ok("a", f64::NAN, 0.0, None),
            Err(FixError::BadLat(_))
        ));
        assert!(matches!(ok("a", 91.0, 0.0, None), Err(FixError::BadLat(_))));
        assert!(matches!(
            ok("a", 0.0, f64::INFINITY, None),
            Err(FixError::BadLon(_))
        ));
        assert!(matches!(
            ok("a", 0.0, -180.5, None),
            Err(FixError::BadLon(_))
        ));
        assert!(matches!(
            ok("a", 0.0, 0.0, Some(-1.0)),
            Err(FixError::BadAccuracy(_))
        ));
    }
}
