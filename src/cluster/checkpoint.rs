//! A cluster partition's checkpoint storage: its engine's state at a position of its input, as
//! one object in the object store, and the pointer to the newest one (a key of the META bucket,
//! moved by compare-and-set); writing one ([`write`]) and restoring from one ([`restore`]).
//!
//! Object layout (`uv` LEB128, `zz` zigzag varints; devices in the embedded store's encoding,
//! `store::codec`):
//!
//! ```text
//! "GDCK" u8 version(2) uv partition uv input_seq uv fence_pos uv ev_mark
//! u8 has_w [zz w] uv recent, then per part applied lately: u64 LE hash (oldest first)
//! uv devices, then per device: uv len + id, uv len + state
//! u64 LE xxh3 of everything before it
//! ```
//!
//! Version 1 has no parts applied lately; it is read with none. A node writes version 2 only
//! once every live node's heartbeat says it reads version 2 ([`Shared::checkpoint_version`]),
//! so during a node-by-node upgrade a node of the earlier version can still take over any
//! partition; until then a takeover starts with no memory of recent parts (a copy of a part
//! applied before it is judged again, as before).
//!
//! Invariants: an object is written under a name no other checkpoint uses (partition, epoch,
//! input position) before the pointer names it, so a pointer never names a half-written or
//! replaced object; the pointer only moves forward in input position (a slower or older owner's
//! checkpoint never replaces a newer one); a pointer moves only once every event the checkpoint
//! covers is in the events stream (the caller waits for that), so a takeover that starts from it
//! never needs an event the checkpoint's input produced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};

use geodwell_core::codec::{self, DecodeError, Reader, put_str, put_uv, put_zz};
use geodwell_core::engine::{DeviceState, Engine};
use geodwell_core::partition::{Driver, Frozen};
use geodwell_core::time::Ts;

use super::lease::Lease;
use super::nats::{Nats, NatsError, in_subject};
use super::outbox::Outbox;
use super::shared::Shared;
use crate::telemetry as t;

/// Where a partition's newest checkpoint is, and what it covers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pointer {
    /// The object holding it.
    pub object: String,
    /// The last input record it covers (stream sequence of `IN_STREAM`).
    pub input_seq: u64,
    /// The fence stream position its engine had applied.
    pub fence_pos: u64,
    /// The events stream's last sequence on the partition's subject when it was frozen: every
    /// event its input produced after that has a higher sequence.
    pub ev_mark: u64,
    /// The object of the checkpoint before it (its input is kept as a fallback).
    pub previous: Option<(String, u64)>,
    /// Who wrote it, with which lease epoch.
    pub node: String,
    /// The lease epoch.
    pub epoch: u64,
    /// When it was written (Unix ms).
    pub at_ms: i64,
    /// Devices in it.
    pub devices: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The META key of partition `p`'s checkpoint pointer.
pub fn pointer_key(p: u16) -> String {
    format!("ck.{p}")
}

/// A decoded checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Partition.
    pub partition: u16,
    /// Last input record covered.
    pub input_seq: u64,
    /// Fence position applied.
    pub fence_pos: u64,
    /// See [`Pointer::ev_mark`].
    pub ev_mark: u64,
    /// The engine's watermark.
    pub watermark: Option<Ts>,
    /// The parts applied lately, oldest first.
    pub recent: Vec<u64>,
    /// Every device.
    pub devices: Vec<DeviceState>,
}

/// The newest checkpoint object version this build reads (and writes, once every live node
/// reads it too).
pub const VERSION: u8 = 2;

/// The newest checkpoint version that every node of `versions` reads (each the newest its
/// heartbeat says it reads; 0: an earlier build's heartbeat, which says nothing), at most this
/// build's [`VERSION`].
pub fn readable_by_all(versions: impl IntoIterator<Item = u8>) -> u8 {
    versions
        .into_iter()
        .map(|v| v.max(1))
        .min()
        .unwrap_or(1)
        .min(VERSION)
}

/// Builds a checkpoint object a chunk of devices at a time (the partition hands devices out in
/// chunks while it goes on working).
#[derive(Debug)]
pub struct Encoder {
    head: Vec<u8>,
    body: Vec<u8>,
    devices: u64,
}

impl Encoder {
    /// Starts the object of `partition` frozen `at`, with the events stream's mark `ev_mark`, in
    /// object `version` (1 or [`VERSION`]; version 1 leaves out the parts applied lately).
    pub fn new(partition: u16, at: &Frozen, ev_mark: u64, version: u8) -> Encoder {
        let version = version.clamp(1, VERSION);
        let mut head = Vec::with_capacity(64 + 8 * at.recent.len());
        head.extend_from_slice(b"GDCK");
        head.push(version);
        put_uv(&mut head, u64::from(partition));
        put_uv(&mut head, at.position);
        put_uv(&mut head, at.fence_pos);
        put_uv(&mut head, ev_mark);
        match at.watermark {
            Some(w) => {
                head.push(1);
                put_zz(&mut head, w.0);
            }
            None => head.push(0),
        }
        if version >= 2 {
            put_uv(&mut head, at.recent.len() as u64);
            for h in at.recent.iter() {
                head.extend_from_slice(&h.to_le_bytes());
            }
        }
        Encoder {
            head,
            body: Vec::new(),
            devices: 0,
        }
    }

    /// Adds devices.
    pub fn devices(&mut self, devices: &[DeviceState]) {
        let mut one = Vec::new();
        for d in devices {
            put_str(&mut self.body, &d.id);
            one.clear();
            codec::encode_device(d, &mut one);
            put_uv(&mut self.body, one.len() as u64);
            self.body.extend_from_slice(&one);
        }
        self.devices += devices.len() as u64;
    }

    /// Devices added so far.
    pub fn count(&self) -> u64 {
        self.devices
    }

    /// The finished object.
    pub fn finish(self) -> Vec<u8> {
        let mut out = self.head;
        put_uv(&mut out, self.devices);
        out.extend_from_slice(&self.body);
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }
}

/// Decodes a checkpoint object.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
    if bytes.len() < 13 {
        return Err(DecodeError("checkpoint too short".into()));
    }
    let (data, sum) = bytes.split_at(bytes.len() - 8);
    let mut want = [0u8; 8];
    want.copy_from_slice(sum);
    if xxhash_rust::xxh3::xxh3_64(data) != u64::from_le_bytes(want) {
        return Err(DecodeError("checkpoint checksum does not match".into()));
    }
    if &data[..4] != b"GDCK" {
        return Err(DecodeError("not a geodwell checkpoint".into()));
    }
    let mut r = Reader { b: data, at: 4 };
    let version = r.u8()?;
    if !(1..=VERSION).contains(&version) {
        return Err(DecodeError(format!("checkpoint version {version} unknown")));
    }
    let partition =
        u16::try_from(r.uv()?).map_err(|_| DecodeError("partition out of range".into()))?;
    let input_seq = r.uv()?;
    let fence_pos = r.uv()?;
    let ev_mark = r.uv()?;
    let watermark = if r.bool()? { Some(Ts(r.zz()?)) } else { None };
    let mut recent = Vec::new();
    if version >= 2 {
        for _ in 0..r.count()? {
            recent.push(r.u64_le()?);
        }
    }
    let n = r.count()?;
    let mut devices = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let id = r.str()?.to_string();
        let len = r.count()?;
        let end =
            r.at.checked_add(len)
                .filter(|&e| e <= data.len())
                .ok_or_else(|| r.err("truncated device"))?;
        devices.push(codec::decode_device(&id, &data[r.at..end])?);
        r.at = end;
    }
    if r.at != data.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(Checkpoint {
        partition,
        input_seq,
        fence_pos,
        ev_mark,
        watermark,
        recent,
        devices,
    })
}

/// Reads partition `p`'s pointer and its revision (from the bucket's leader).
pub async fn read_pointer(nats: &Nats, p: u16) -> Result<Option<(Pointer, u64)>, NatsError> {
    let Some((v, rev)) = Nats::kv_read(&nats.meta, &pointer_key(p)).await? else {
        return Ok(None);
    };
    let ptr = serde_json::from_slice(&v).map_err(|e| NatsError::Corrupt {
        what: format!("checkpoint pointer of partition {p}"),
        source: e.into(),
    })?;
    Ok(Some((ptr, rev)))
}

/// Moves partition `p`'s pointer to `new` unless the current one is already as far: true when
/// it moved. Retries a lost compare-and-set against the newer value.
pub async fn move_pointer(nats: &Nats, p: u16, new: &Pointer) -> Result<bool, NatsError> {
    let key = pointer_key(p);
    let body = bytes::Bytes::from(serde_json::to_vec(new).unwrap_or_default());
    for _ in 0..8 {
        let res = match read_pointer(nats, p).await? {
            // An earlier try that timed out here may have landed.
            Some((cur, _)) if cur.object == new.object => return Ok(true),
            Some((cur, _)) if cur.input_seq >= new.input_seq => return Ok(false),
            Some((_, rev)) => nats
                .meta
                .update(&key, body.clone(), rev)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            None => nats
                .meta
                .create(&key, body.clone())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        };
        match res {
            Ok(()) => return Ok(true),
            Err(e) => {
                tracing::debug!(partition = p, error = %e, "checkpoint pointer CAS lost; re-reading")
            }
        }
    }
    Err(NatsError::request(
        format!("move the checkpoint pointer of partition {p}"),
        "kept losing the compare-and-set",
    ))
}

/// A frozen checkpoint, its devices all handed out, to write.
pub struct Write {
    /// The object's bytes so far.
    pub enc: Encoder,
    /// Events the partition had produced at the freeze (the pointer waits for them).
    pub produced: u64,
    /// The last input record it covers.
    pub input_seq: u64,
    /// The fence position it covers.
    pub fence_pos: u64,
    /// The events subject's last sequence at the freeze.
    pub ev_mark: u64,
    /// When the freeze began.
    pub started: Instant,
}

/// Writes a frozen checkpoint: the object, then (once every event produced before the freeze is
/// in the stream, and while the lease holds) the pointer; then purges the input the previous
/// checkpoint covered and deletes the object before it. Returns the new pointer once it moved.
pub async fn write(
    sh: Arc<Shared>,
    p: u16,
    lease: Arc<Lease>,
    outbox: Outbox,
    f: Write,
    previous: Option<Pointer>,
) -> Option<Pointer> {
    let Write {
        enc,
        produced,
        input_seq,
        fence_pos,
        ev_mark,
        started,
    } = f;
    let devices = enc.count();
    let bytes = enc.finish();
    let object = format!("ck-{p}-{}-{input_seq}", lease.epoch());
    let put = sh
        .nats
        .objects
        .put(
            async_nats::jetstream::object_store::ObjectMetadata {
                name: object.clone(),
                chunk_size: Some(256 * 1024),
                ..Default::default()
            },
            &mut bytes.as_slice(),
        )
        .await;
    if let Err(e) = put {
        counter!(t::CLUSTER_CHECKPOINT_FAILURES).increment(1);
        tracing::warn!(partition = p, error = %e, "checkpoint object not written");
        return None;
    }
    if !outbox.wait_acked(produced).await || !lease.valid() {
        let _ = sh.nats.objects.delete(object.as_str()).await;
        return None;
    }
    let ptr = Pointer {
        object: object.clone(),
        input_seq,
        fence_pos,
        ev_mark,
        previous: previous.as_ref().map(|c| (c.object.clone(), c.input_seq)),
        node: sh.node.clone(),
        epoch: lease.epoch(),
        at_ms: sh.watermark.wall().now().0,
        devices,
        bytes: bytes.len() as u64,
    };
    match move_pointer(&sh.nats, p, &ptr).await {
        Ok(true) => {}
        Ok(false) => {
            // The pointer is already as far (a newer holder, or a later write of this one):
            // this object is not needed, unless the pointer names it as its fallback.
            let named = read_pointer(&sh.nats, p).await.map(|c| {
                c.is_some_and(|(c, _)| {
                    c.object == object || c.previous.as_ref().is_some_and(|(o, _)| *o == object)
                })
            });
            if matches!(named, Ok(false)) {
                let _ = sh.nats.objects.delete(object.as_str()).await;
            }
            return None;
        }
        // Unknown whether it moved: the object stays (an orphan at worst).
        Err(_) => return None,
    }
    counter!(t::CLUSTER_CHECKPOINTS).increment(1);
    histogram!(t::CLUSTER_CHECKPOINT_SECONDS).record(started.elapsed().as_secs_f64());
    gauge!(t::CLUSTER_CHECKPOINT_BYTES, "partition" => p.to_string()).set(bytes.len() as f64);
    // The previous checkpoint stays as the fallback: its input is kept, the one before goes.
    if let Some(prev) = previous
        && let Some((older, older_seq)) = prev.previous
    {
        let _ = sh.nats.objects.delete(older.as_str()).await;
        let _ = sh
            .nats
            .input
            .purge()
            .filter(in_subject(p))
            .sequence(older_seq + 1)
            .await;
    }
    Some(ptr)
}

/// Rebuilds partition `p`'s driver from its newest checkpoint (falling back to the one before
/// when the newest cannot be read), or an empty one, on the runtime's one restore path
/// ([`Driver::restore`]).
pub async fn restore(sh: &Shared, p: u16) -> Result<(Driver, Option<Pointer>), NatsError> {
    let Some((ptr, _)) = read_pointer(&sh.nats, p).await? else {
        // A partition that never checkpointed starts empty, at fence position 0: its input holds
        // a marker for every fence change since the cluster began.
        return Ok((Driver::new(Engine::new(sh.engine.clone()), 0, 0), None));
    };
    match restore_from(sh, p, &ptr.object).await {
        Ok((driver, ck)) if ck.input_seq == ptr.input_seq => Ok((driver, Some(ptr))),
        Ok(_) => Err(NatsError::Corrupt {
            what: format!("checkpoint {}", ptr.object),
            source: "its position is not the pointer's".into(),
        }),
        Err(e) => {
            let Some((older, older_seq)) = ptr.previous.clone() else {
                return Err(e);
            };
            tracing::warn!(partition = p, error = %e, fallback = %older, "newest checkpoint unreadable; using the one before");
            let (driver, ck) = restore_from(sh, p, &older).await?;
            let fallback = Pointer {
                object: older,
                input_seq: older_seq,
                fence_pos: ck.fence_pos,
                ev_mark: ck.ev_mark,
                previous: None,
                at_ms: 0,
                devices: ck.devices.len() as u64,
                bytes: 0,
                ..ptr
            };
            Ok((driver, Some(fallback)))
        }
    }
}

async fn restore_from(
    sh: &Shared,
    p: u16,
    object: &str,
) -> Result<(Driver, Checkpoint), NatsError> {
    let bytes = super::fences::read_object(&sh.nats, object).await?;
    let mut ck = tokio::task::spawn_blocking(move || decode(&bytes))
        .await
        .map_err(|e| NatsError::request("decode a checkpoint", e))?
        .map_err(|e| NatsError::Corrupt {
            what: format!("checkpoint {object}"),
            source: e.into(),
        })?;
    if ck.partition != p {
        return Err(NatsError::Corrupt {
            what: format!("checkpoint {object}"),
            source: format!("it is partition {}'s", ck.partition).into(),
        });
    }
    let fence_pos = ck.fence_pos;
    if !sh
        .fences
        .wait_applied(fence_pos, Duration::from_secs(60))
        .await
    {
        return Err(NatsError::request(
            "restore a checkpoint",
            format!("fence position {fence_pos} not reached on this node"),
        ));
    }
    let fences = sh
        .fences
        .set_at(fence_pos)
        .map_err(|e| NatsError::request("restore a checkpoint", e))?;
    let devices = std::mem::take(&mut ck.devices);
    let cfg = sh.engine.clone();
    let at = Frozen {
        position: ck.input_seq,
        fence_pos,
        watermark: ck.watermark,
        recent: Arc::from(std::mem::take(&mut ck.recent)),
    };
    let driver = tokio::task::spawn_blocking(move || {
        Driver::restore(cfg, fences, devices, at).map(|(d, _)| d)
    })
    .await
    .map_err(|e| NatsError::request("restore a checkpoint", e))?
    .map_err(|e| NatsError::Corrupt {
        what: format!("checkpoint {object}"),
        source: e.into(),
    })?;
    Ok((driver, ck))
}

#[cfg(test)]
mod tests {
    use super::*;
    use geodwell_core::pairs::PairState;

    fn device(id: &str) -> DeviceState {
        DeviceState {
            id: id.into(),
            last_applied: Some(1_700_000_000_000),
            last_position: Some((53.5, -9.9)),
            buffer: vec![(1_700_000_001_000, 53.6, -9.8, Some(4.0))],
            pairs: Vec::<(String, PairState)>::new(),
            frontier: Some(1_700_000_000_000),
            hold_until: None,
        }
    }

    #[test]
    fn the_version_written_is_the_newest_every_live_node_reads() {
        assert_eq!(readable_by_all([2, 2, 2]), 2);
        assert_eq!(
            readable_by_all([2, 0, 2]),
            1,
            "an earlier build's heartbeat"
        );
        assert_eq!(readable_by_all([2, 1]), 1);
        assert_eq!(
            readable_by_all([9]),
            2,
            "never newer than this build writes"
        );
        assert_eq!(readable_by_all([]), 1, "no heartbeat read yet");
    }

    #[test]
    fn checkpoints_round_trip_and_damage_is_refused() {
        let at = Frozen {
            recent: Arc::from([3u64, u64::MAX]),
            ..Frozen::at(1234, 56, Some(Ts(-5)))
        };
        let mut enc = Encoder::new(7, &at, 789, VERSION);
        enc.devices(&[device("a"), device("truck-17")]);
        enc.devices(&[device("ü")]);
        assert_eq!(enc.count(), 3);
        let bytes = enc.finish();
        let ck = decode(&bytes).unwrap();
        assert_eq!(
            (
                ck.partition,
                ck.input_seq,
                ck.fence_pos,
                ck.ev_mark,
                ck.watermark
            ),
            (7, 1234, 56, 789, Some(Ts(-5)))
        );
        assert_eq!(ck.recent, vec![3, u64::MAX]);
        assert_eq!(
            ck.devices,
            vec![device("a"), device("truck-17"), device("ü")]
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert!(decode(&bad).is_err(), "flipped byte {i}");
        }
        let empty = Encoder::new(0, &Frozen::at(0, 0, None), 0, VERSION).finish();
        assert_eq!(decode(&empty).unwrap().devices, vec![]);
    }

    /// An object of version 1 (no parts applied lately) still reads, and this build writes
    /// version 1 byte for byte as an earlier build did (for such a build to read while it is
    /// live), leaving out the parts applied lately.
    #[test]
    fn a_version_1_checkpoint_reads_with_no_parts_applied_lately_and_is_written_alike() {
        let mut v1 = b"GDCK".to_vec();
        v1.push(1);
        for v in [7u64, 1234, 56, 789] {
            put_uv(&mut v1, v);
        }
        v1.push(0); // no watermark
        put_uv(&mut v1, 1);
        put_str(&mut v1, "a");
        let mut one = Vec::new();
        codec::encode_device(&device("a"), &mut one);
        put_uv(&mut v1, one.len() as u64);
        v1.extend_from_slice(&one);
        let sum = xxhash_rust::xxh3::xxh3_64(&v1);
        v1.extend_from_slice(&sum.to_le_bytes());
        let at = Frozen {
            recent: Arc::from([3u64, 4]),
            ..Frozen::at(1234, 56, None)
        };
        let mut enc = Encoder::new(7, &at, 789, 1);
        enc.devices(&[device("a")]);
        assert_eq!(enc.finish(), v1, "version 1 as an earlier build wrote it");
        let ck = decode(&v1).unwrap();
        assert_eq!(
            (ck.input_seq, ck.recent.len(), ck.devices),
            (1234, 0, vec![device("a")])
        );
    }
}
