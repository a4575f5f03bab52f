//! The store's encodings: the core's shared ones ([`geodwell_core::codec`]: varints, device
//! records) and the fixed-width `meta` values of the live file.

pub(crate) use geodwell_core::codec::*;

/// Decodes a fixed-width little-endian `meta` value.
pub(crate) fn meta_array<const N: usize>(key: &str, v: &[u8]) -> Result<[u8; N], DecodeError> {
    v.try_into().map_err(|_| {
        DecodeError(format!(
            "meta value {key:?} has {} bytes, expected {N}",
            v.len()
        ))
    })
}
