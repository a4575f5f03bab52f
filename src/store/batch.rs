//! [`Batch`]: one set of changes to the store.
//!
//! Semantics of one batch, as [`super::Store::commit`] applies it: input records and fence
//! changes inserted before the truncations (a checkpoint never covers records of the same
//! commit), events inserted before `trim_events_below` deletes every event with a smaller `seq`,
//! and each `Some` scalar replaces the stored value.

use std::sync::Arc;

/// Changes to the live file, committed together in one write transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Input records to append: (shard, seq, record).
    pub inputs: Vec<(u16, u64, Vec<u8>)>,
    /// Fence changes to append: (change number, change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
    /// Per shard, delete its input records up to this `seq` (a checkpoint covers them).
    pub truncate_inputs: Vec<(u16, u64)>,
    /// Delete fence changes up to this number (every shard's checkpoint has them).
    pub truncate_fence_changes: Option<u64>,
    /// Events to append: (seq, event JSON text).
    pub events: Vec<(u64, Arc<str>)>,
    /// Delete every stored event with a `seq` below this (retention).
    pub trim_events_below: Option<u64>,
    /// The new watermark, Unix ms.
    pub watermark: Option<i64>,
    /// The new highest fix time seen (event clock mode), Unix ms.
    pub max_seen: Option<i64>,
    /// The `seq` the next event will get.
    pub next_seq: Option<u64>,
    /// Delivery cursors to write: (sink name, next seq to deliver).
    pub cursors: Vec<(String, u64)>,
}

/// Layout of an encoded batch (the journal's payload, `journal.rs`), with `uv` an unsigned
/// varint and `zz` a zigzag varint as in `codec.rs`:
///
/// ```text
/// uv n, n x (u16 LE shard, uv seq, uv len + record)          inputs
/// uv n, n x (uv change number, uv len + change)                fence changes
/// uv n, n x (u16 LE shard, uv seq)                             truncate_inputs
/// u8 flags: 1 truncate_fence_changes, 2 trim_events_below, 4 watermark, 8 max_seen, 16 next_seq
///    then each present value in that order (uv, uv, zz, zz, uv)
/// uv n, n x (uv seq, uv len + JSON)                            events
/// uv n, n x (uv len + name, uv seq)                            cursors
/// ```
impl Batch {
    /// Appends the batch's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        use super::codec::{put_str, put_uv, put_zz};
        let put_bytes = |out: &mut Vec<u8>, b: &[u8]| {
            put_uv(out, b.len() as u64);
            out.extend_from_slice(b);
        };
        put_uv(out, self.inputs.len() as u64);
        for (shard, seq, rec) in &self.inputs {
            out.extend_from_slice(&shard.to_le_bytes());
            put_uv(out, *seq);
            put_bytes(out, rec);
        }
        put_uv(out, self.fence_changes.len() as u64);
        for (n, change) in &self.fence_changes {
            put_uv(out, *n);
            put_bytes(out, change);
        }
        put_uv(out, self.truncate_inputs.len() as u64);
        for (shard, upto) in &self.truncate_inputs {
            out.extend_from_slice(&shard.to_le_bytes());
            put_uv(out, *upto);
        }
        let flags = u8::from(self.truncate_fence_changes.is_some())
            | (u8::from(self.trim_events_below.is_some()) << 1)
            | (u8::from(self.watermark.is_some()) << 2)
            | (u8::from(self.max_seen.is_some()) << 3)
            | (u8::from(self.next_seq.is_some()) << 4);
        out.push(flags);
        if let Some(v) = self.truncate_fence_changes {
            put_uv(out, v);
        }
        if let Some(v) = self.trim_events_below {
            put_uv(out, v);
        }
        if let Some(v) = self.watermark {
            put_zz(out, v);
        }
        if let Some(v) = self.max_seen {
            put_zz(out, v);
        }
        if let Some(v) = self.next_seq {
            put_uv(out, v);
        }
        put_uv(out, self.events.len() as u64);
        for (seq, json) in &self.events {
            put_uv(out, *seq);
            put_str(out, json);
        }
        put_uv(out, self.cursors.len() as u64);
        for (name, at) in &self.cursors {
            put_str(out, name);
            put_uv(out, *at);
        }
    }

    /// Decodes what [`Batch::encode`] wrote; refuses truncation, invalid UTF-8, unknown flags
    /// and trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Batch, super::codec::DecodeError> {
        let mut r = super::codec::Reader { b: bytes, at: 0 };
        let mut b = Batch::default();
        let u16_le = |r: &mut super::codec::Reader<'_>| -> Result<u16, super::codec::DecodeError> {
            Ok(u16::from_le_bytes([r.u8()?, r.u8()?]))
        };
        for _ in 0..r.count()? {
            let shard = u16_le(&mut r)?;
            let seq = r.uv()?;
            b.inputs.push((shard, seq, r.bytes()?.to_vec()));
        }
        for _ in 0..r.count()? {
            let n = r.uv()?;
            b.fence_changes.push((n, r.bytes()?.to_vec()));
        }
        for _ in 0..r.count()? {
            let shard = u16_le(&mut r)?;
            b.truncate_inputs.push((shard, r.uv()?));
        }
        let flags = r.u8()?;
        if flags & !0x1f != 0 {
            return Err(r.err("unknown batch flags"));
        }
        if flags & 1 != 0 {
            b.truncate_fence_changes = Some(r.uv()?);
        }
        if flags & 2 != 0 {
            b.trim_events_below = Some(r.uv()?);
        }
        if flags & 4 != 0 {
            b.watermark = Some(r.zz()?);
        }
        if flags & 8 != 0 {
            b.max_seen = Some(r.zz()?);
        }
        if flags & 16 != 0 {
            b.next_seq = Some(r.uv()?);
        }
        for _ in 0..r.count()? {
            let seq = r.uv()?;
            b.events.push((seq, Arc::from(r.str()?)));
        }
        for _ in 0..r.count()? {
            let name = r.str()?.to_string();
            b.cursors.push((name, r.uv()?));
        }
        if r.at != bytes.len() {
            return Err(r.err("trailing bytes"));
        }
        Ok(b)
    }

    /// Rough bytes held in memory by the batch (the applier's backlog bound).
    pub fn approx_bytes(&self) -> usize {
        let inputs: usize = self.inputs.iter().map(|(_, _, r)| r.len() + 32).sum();
        let fences: usize = self.fence_changes.iter().map(|(_, c)| c.len() + 32).sum();
        let events: usize = self.events.iter().map(|(_, j)| j.len() + 24).sum();
        let cursors: usize = self.cursors.iter().map(|(n, _)| n.len() + 32).sum();
        inputs + fences + events + cursors + 16 * self.truncate_inputs.len() + 128
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_and_damage_is_refused() {
        let b = Batch {
            inputs: vec![(0, 7, vec![1, 2, 3]), (3, 1 << 40, vec![])],
            fence_changes: vec![(5, b"\x01{}".to_vec())],
            truncate_inputs: vec![(1, 9)],
            truncate_fence_changes: Some(4),
            events: vec![(11, Arc::from("{\"a\":1}")), (12, Arc::from("é"))],
            trim_events_below: Some(3),
            watermark: Some(-1_700_000_000_000),
            max_seen: None,
            next_seq: Some(13),
            cursors: vec![("hook".into(), 10)],
        };
        let mut out = Vec::new();
        b.encode(&mut out);
        assert_eq!(Batch::decode(&out).unwrap(), b);
        let mut empty = Vec::new();
        Batch::default().encode(&mut empty);
        assert_eq!(Batch::decode(&empty).unwrap(), Batch::default());
        for cut in 0..out.len() {
            assert!(Batch::decode(&out[..cut]).is_err(), "truncated at {cut}");
        }
        let mut longer = out.clone();
        longer.push(0);
        assert!(Batch::decode(&longer).is_err());
    }
}
