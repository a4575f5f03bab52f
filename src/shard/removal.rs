//! Replaying a removal record ([`apply_removal`]): shared by a warm start's replay and a
//! cluster partition reading its input, so both remove exactly what the record says, the same
//! way.

/// Applies a removal record to `engine` (a replay, or a cluster partition reading its input):
/// first the watermark it was made at, then each device: removed outright, or (an idle
/// expiry) forgotten if still idle. Returns how many devices it removed.
pub fn apply_removal(
    engine: &mut geodwell_core::engine::Engine,
    r: &crate::store::input::Removal,
    out: &mut Vec<geodwell_core::event::Event>,
) -> usize {
    if let Some(w) = r.w_before {
        engine.advance(w, out);
    }
    let w = engine.watermark();
    let mut removed = 0;
    for id in &r.ids {
        let gone = match (r.idle, w) {
            // A removal: the device is dropped (a tombstone kept while delayed fixes may come).
            (None, _) => engine.remove_device(id),
            // Idle expiry: forgotten entirely, if still idle.
            (Some(ttl), Some(w)) => {
                engine.is_idle(id, geodwell_core::engine::IdleRule { ttl }, w)
                    && engine.forget_device(id)
            }
            (Some(_), None) => false,
        };
        if gone {
            removed += 1;
        }
    }
    removed
}
