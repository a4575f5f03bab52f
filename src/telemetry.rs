//! Metric names, their descriptions, the Prometheus recorder, and tracing setup.
//!
//! Every metric is named here, once, as `geodwell_<name>_<unit>[_total]` (Vector's convention), so
//! the README's metrics list, the dashboards and the code cannot disagree. The recorder is global
//! to the process (the `metrics` facade's model); [`install`] is idempotent so several servers in
//! one test process share it.
//!
//! Why this file is long: it is the one list of every metric (a constant, its description and,
//! for counters with known labels, the series exported at 0), which is the point of it; split by
//! subsystem, the README, the dashboard check and the code would have several lists to agree.

use std::sync::OnceLock;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Fixes received, by `transport` (`http`, `ws`, `osmand`, `owntracks`).
pub const FIXES_RECEIVED: &str = "geodwell_fixes_received_total";
/// Fixes rejected, by `reason`.
pub const FIXES_REJECTED: &str = "geodwell_fixes_rejected_total";
/// Late fixes (counted, not applied).
pub const FIXES_LATE: &str = "geodwell_fixes_late_total";
/// How long after its `ts` a fix arrived (live clock), seconds.
pub const FIX_ARRIVAL_DELAY: &str = "geodwell_fix_arrival_delay_seconds";
/// Duplicate fixes (counted, not applied).
pub const FIXES_DUPLICATE: &str = "geodwell_fixes_duplicate_total";
/// Events emitted, by `type`.
pub const EVENTS_EMITTED: &str = "geodwell_events_emitted_total";
/// Live pair records, by `shard`.
pub const PAIRS_LIVE: &str = "geodwell_pairs_live";
/// Devices known, by `shard`.
pub const DEVICES: &str = "geodwell_devices";
/// Devices removed, by `reason` (`delete`: `DELETE /v1/devices/{id}`; `idle`: `devices.idle_ttl`).
pub const DEVICES_REMOVED: &str = "geodwell_devices_removed_total";
/// Fixes waiting in reorder buffers, by `shard`.
pub const FIXES_BUFFERED: &str = "geodwell_fixes_buffered";
/// Live wheel timers, by `shard`.
pub const WHEEL_TIMERS_LIVE: &str = "geodwell_wheel_timers_live";
/// Wheel tombstones not yet dropped, by `shard`.
pub const WHEEL_TOMBSTONES: &str = "geodwell_wheel_tombstones";
/// Due timers carried to the next tick by the fire cap, by `shard`.
pub const WHEEL_CARRY: &str = "geodwell_wheel_carry";
/// Duration of one driver tick (watermark advance), seconds.
pub const WHEEL_TICK_SECONDS: &str = "geodwell_wheel_tick_duration_seconds";
/// From a batch's arrival to the publication of the events it caused, seconds.
pub const INGEST_TO_EVENT_SECONDS: &str = "geodwell_ingest_to_event_latency_seconds";
/// Wall clock minus watermark, seconds, by `shard`.
pub const WATERMARK_LAG_SECONDS: &str = "geodwell_watermark_lag_seconds";
/// Connected event subscribers.
pub const SUBSCRIBERS: &str = "geodwell_subscribers";
/// Subscribers closed for falling behind.
pub const SUBSCRIBERS_LAGGED: &str = "geodwell_subscribers_lagged_total";
/// Events sent to subscribers.
pub const SUBSCRIBER_EVENTS_SENT: &str = "geodwell_subscriber_events_sent_total";
/// Requests refused by authentication, by `reason` (missing, invalid, forbidden).
pub const AUTH_FAILURES: &str = "geodwell_auth_failures_total";
/// HTTP requests by route template, method (a known one or `other`) and status class.
pub const HTTP_REQUESTS: &str = "geodwell_http_requests_total";
/// Open client connections (WebSockets included).
pub const HTTP_CONNECTIONS: &str = "geodwell_http_connections";
/// Client connections accepted.
pub const HTTP_CONNECTIONS_ACCEPTED: &str = "geodwell_http_connections_accepted_total";
/// Connections asked to close to make room at the connection limit.
pub const HTTP_CONNECTIONS_EVICTED: &str = "geodwell_http_connections_evicted_total";
/// Connections refused at the limit (nothing could be asked to close).
pub const HTTP_CONNECTIONS_REFUSED: &str = "geodwell_http_connections_refused_total";
/// Failed accepts (e.g. out of file descriptors).
pub const HTTP_ACCEPT_ERRORS: &str = "geodwell_http_accept_errors_total";
/// Connections or requests ended by a timeout, by `kind` (`header`, `body`, `write`).
pub const HTTP_TIMEOUTS: &str = "geodwell_http_timeouts_total";
/// Requests refused because their page's origin is not allowed.
pub const HTTP_ORIGIN_REFUSED: &str = "geodwell_http_origin_refused_total";
/// Bytes of queued input held in the memory budget now.
pub const INGEST_QUEUED_BYTES: &str = "geodwell_ingest_queued_bytes";
/// The memory budget for queued input, bytes.
pub const INGEST_QUEUED_BYTES_MAX: &str = "geodwell_ingest_queued_bytes_max";
/// Requests and frames refused because the memory budget was in use.
pub const INGEST_BUDGET_REFUSED: &str = "geodwell_ingest_budget_refused_total";
/// Most devices held (`ingest.max_devices`).
pub const DEVICES_MAX: &str = "geodwell_devices_max";
/// Most event subscribers (`events.max_subscribers`).
pub const SUBSCRIBERS_MAX: &str = "geodwell_subscribers_max";
/// Open connections allowed (`server.max_connections`, resolved).
pub const HTTP_CONNECTIONS_MAX: &str = "geodwell_http_connections_max";
/// Outgoing connections refused because the target is not a public address.
pub const OUTBOUND_REFUSED: &str = "geodwell_outbound_refused_total";
/// The HTTP server's TLS leaf certificate's end of validity, Unix seconds; absent without TLS.
pub const TLS_CERT_EXPIRY: &str = "geodwell_tls_cert_expiry_timestamp_seconds";
/// Whether the MQTT ingest connection is up (1) or not (0); absent when MQTT is off.
pub const MQTT_CONNECTED: &str = "geodwell_mqtt_connected";
/// MQTT ingest connection attempts, by `outcome` (connected, refused, failed).
pub const MQTT_CONNECTS: &str = "geodwell_mqtt_connects_total";
/// MQTT messages read and not yet acknowledged.
pub const MQTT_QUEUED: &str = "geodwell_mqtt_queued_messages";
/// MQTT messages read by ingest (each acknowledged once its fixes are durable).
pub const MQTT_MESSAGES: &str = "geodwell_mqtt_messages_total";
/// HTTP request duration, seconds, by matched `route`.
pub const HTTP_REQUEST_SECONDS: &str = "geodwell_http_request_duration_seconds";
/// Events held in the event log.
pub const EVENT_LOG_EVENTS: &str = "geodwell_event_log_events";
/// Fences loaded.
pub const FENCES: &str = "geodwell_fences";
/// State store commit duration, seconds.
pub const STORE_COMMIT_SECONDS: &str = "geodwell_store_commit_duration_seconds";
/// State store commits.
pub const STORE_COMMITS: &str = "geodwell_store_commits_total";
/// Bytes of input records appended to the input log.
pub const STORE_LOG_APPENDED_BYTES: &str = "geodwell_store_log_appended_bytes_total";
/// Size of the live store file (input log, events, cursors), bytes.
pub const STORE_LOG_BYTES: &str = "geodwell_store_log_bytes";
/// Checkpoints written.
pub const STORE_CHECKPOINTS: &str = "geodwell_store_checkpoints_total";
/// Checkpoints that could not be written.
pub const STORE_CHECKPOINT_FAILURES: &str = "geodwell_store_checkpoint_failures_total";
/// Duration of one checkpoint round, seconds.
pub const STORE_CHECKPOINT_SECONDS: &str = "geodwell_store_checkpoint_seconds";
/// Devices written by the last checkpoint.
pub const STORE_CHECKPOINT_DEVICES: &str = "geodwell_store_checkpoint_devices";
/// Size of the checkpoint file, bytes.
pub const STORE_CHECKPOINT_BYTES: &str = "geodwell_store_checkpoint_bytes";
/// Seconds since the last checkpoint committed.
pub const STORE_CHECKPOINT_AGE_SECONDS: &str = "geodwell_store_checkpoint_age_seconds";
/// Memory held by the checkpoint writer's sort buffer, bytes (0 between rounds).
pub const STORE_CHECKPOINT_SORT_BUFFER_BYTES: &str = "geodwell_store_checkpoint_sort_buffer_bytes";
/// Failed state store commits (data kept and retried).
pub const STORE_COMMIT_FAILURES: &str = "geodwell_store_commit_failures_total";
/// Bytes of the store's journal on disk.
pub const STORE_JOURNAL_BYTES: &str = "geodwell_store_journal_bytes";
/// Bytes of journaled commits not yet written into the live store file.
pub const STORE_APPLY_BACKLOG_BYTES: &str = "geodwell_store_apply_backlog_bytes";
/// Duration of one applier transaction (journaled commits into the live file), seconds.
pub const STORE_APPLY_SECONDS: &str = "geodwell_store_apply_seconds";
/// Applier transactions that failed (retried; the commits stay in the journal).
pub const STORE_APPLY_FAILURES: &str = "geodwell_store_apply_failures_total";
/// Events delivered to a webhook receiver (2xx), by `sink`.
pub const WEBHOOK_SENT: &str = "geodwell_webhook_sent_total";
/// Failed webhook attempts (non-2xx, timeout, connection error), by `sink`.
pub const WEBHOOK_FAILED: &str = "geodwell_webhook_failed_total";
/// Webhook attempts after the first for an event, by `sink`.
pub const WEBHOOK_RETRIES: &str = "geodwell_webhook_retries_total";
/// Events dead-lettered after `max_attempts`, by `sink`.
pub const WEBHOOK_DEAD_LETTERED: &str = "geodwell_webhook_dead_lettered_total";
/// Events lost to retention before a lagging webhook sink processed them, by `sink`.
pub const WEBHOOK_DROPPED: &str = "geodwell_webhook_dropped_total";
/// Events published but not yet processed by a webhook sink, by `sink`.
pub const WEBHOOK_LAG_EVENTS: &str = "geodwell_webhook_lag_events";
/// Duration of one webhook attempt, seconds, by `sink`.
pub const WEBHOOK_DELIVERY_SECONDS: &str = "geodwell_webhook_delivery_duration_seconds";
/// Subjects a NATS sink's connection remembers as in a stream or not, by `sink`.
pub const WEBHOOK_SUBJECT_CACHE: &str = "geodwell_webhook_subject_cache_entries";

/// Partitions this cluster node owns.
pub const CLUSTER_PARTITIONS_OWNED: &str = "geodwell_cluster_partitions_owned";
/// Live nodes this cluster node sees.
pub const CLUSTER_NODES: &str = "geodwell_cluster_nodes";
/// Partitions taken over by this node.
pub const CLUSTER_TAKEOVERS: &str = "geodwell_cluster_takeovers_total";
/// Leader elections of the input and events streams this node heard of (`stream`).
pub const CLUSTER_LEADER_ELECTIONS: &str = "geodwell_cluster_stream_leader_elections_total";
/// Takeover phase durations.
pub const CLUSTER_TAKEOVER_SECONDS: &str = "geodwell_cluster_takeover_seconds";
/// Leases this node lost to another.
pub const CLUSTER_LEASES_LOST: &str = "geodwell_cluster_leases_lost_total";
/// Partition leases this node took back after they expired under its running partition.
pub const CLUSTER_LEASES_RECLAIMED: &str = "geodwell_cluster_leases_reclaimed_total";
/// Partition input consumers found stalled with input waiting (and re-created).
pub const CLUSTER_INPUT_STALLS: &str = "geodwell_cluster_input_stalls_total";
/// Partition input records read from the stream's leader while the consumer was re-created.
pub const CLUSTER_INPUT_BRIDGED: &str = "geodwell_cluster_input_bridged_total";
/// Partition tasks that failed.
pub const CLUSTER_PARTITION_FAILURES: &str = "geodwell_cluster_partition_failures_total";
/// Input records a partition has not applied yet.
pub const CLUSTER_PARTITION_LAG: &str = "geodwell_cluster_partition_lag_records";
/// Partition checkpoints written.
pub const CLUSTER_CHECKPOINTS: &str = "geodwell_cluster_checkpoints_total";
/// Partition checkpoints that could not be written.
pub const CLUSTER_CHECKPOINT_FAILURES: &str = "geodwell_cluster_checkpoint_failures_total";
/// Duration of a partition checkpoint.
pub const CLUSTER_CHECKPOINT_SECONDS: &str = "geodwell_cluster_checkpoint_seconds";
/// Size of a partition's newest checkpoint.
pub const CLUSTER_CHECKPOINT_BYTES: &str = "geodwell_cluster_checkpoint_bytes";
/// Age of a partition's newest checkpoint.
pub const CLUSTER_CHECKPOINT_AGE_SECONDS: &str = "geodwell_cluster_checkpoint_age_seconds";
/// Event publish duration (to its PubAck).
pub const CLUSTER_PUBLISH_SECONDS: &str = "geodwell_cluster_event_publish_seconds";
/// Event publishes retried.
pub const CLUSTER_PUBLISH_RETRIES: &str = "geodwell_cluster_event_publish_retries_total";
/// Event publishes refused because someone else published on the partition.
pub const CLUSTER_FENCED_PUBLISHES: &str = "geodwell_cluster_fenced_publishes_total";
/// Replayed events not published again.
pub const CLUSTER_EVENTS_SUPPRESSED: &str = "geodwell_cluster_events_suppressed_total";
/// Watermark ticks written into partition inputs.
pub const CLUSTER_TICKS: &str = "geodwell_cluster_ticks_total";
/// Fix batch parts that got no PubAck.
pub const CLUSTER_INGEST_FAILURES: &str = "geodwell_cluster_ingest_failures_total";
/// Fixes answered accepted without their owner's outcome.
pub const CLUSTER_OUTCOMES_UNCONFIRMED: &str = "geodwell_cluster_outcomes_unconfirmed_total";
/// Fence writes.
pub const CLUSTER_FENCE_WRITES: &str = "geodwell_cluster_fence_writes_total";
/// Fence stream compactions.
pub const CLUSTER_FENCE_COMPACTIONS: &str = "geodwell_cluster_fence_compactions_total";
/// Events skipped by the feed (behind the stream's retention).
pub const CLUSTER_FEED_SKIPPED: &str = "geodwell_cluster_feed_skipped_total";
/// Gauge: input records not yet applied, summed over the partitions this node owns.
pub const CLUSTER_LAG_RECORDS: &str = "geodwell_cluster_lag_records";
/// Gauge: the oldest checkpoint among the partitions this node owns, seconds.
pub const CLUSTER_CHECKPOINT_AGE_MAX_SECONDS: &str = "geodwell_cluster_checkpoint_age_max_seconds";
/// Counter: batches refused because a partition they touch lags more than `ingest.shard_queue`.
pub const CLUSTER_LAG_REFUSED: &str = "geodwell_cluster_lag_refused_total";
/// Histogram: one batch part's publish until its PubAck.
pub const CLUSTER_INGEST_ACK_SECONDS: &str = "geodwell_cluster_ingest_ack_seconds";

/// Gauge, always 1: the running binary's `version` (and its build `profile`).
pub const BUILD_INFO: &str = "geodwell_build_info";

/// Process metrics (`geodwell_process_cpu_seconds_total`, `_resident_memory_bytes`,
/// `_open_fds`, `_max_fds`, `_threads`, `_start_time_seconds`, ...), read from the OS at each
/// scrape ([`collect_process`]).
fn process_collector() -> &'static metrics_process::Collector {
    static C: OnceLock<metrics_process::Collector> = OnceLock::new();
    C.get_or_init(|| metrics_process::Collector::new("geodwell_"))
}

/// Reads the process metrics now (called before each render of `/metrics`).
pub fn collect_process() {
    process_collector().collect();
}

/// Ingest transports: the closed set of `transport` label values.
pub const TRANSPORTS: [&str; 5] = ["http", "ws", "osmand", "owntracks", "mqtt"];

/// Exports the counters whose label values are known before the first increment at 0 (for
/// rejections: `reasons`, the item codes and `overloaded`), so that `rate()` and alerts see a
/// series from the start.
pub fn export_zero_series(reasons: &[&'static str]) {
    for transport in TRANSPORTS {
        metrics::counter!(FIXES_RECEIVED, "transport" => transport).absolute(0);
    }
    for reason in reasons.iter().copied().chain(["overloaded"]) {
        metrics::counter!(FIXES_REJECTED, "reason" => reason).absolute(0);
    }
    for kind in ["enter", "exit", "dwell"] {
        metrics::counter!(EVENTS_EMITTED, "type" => kind).absolute(0);
    }
}

/// How often histogram samples are folded into their buckets when nobody scrapes `/metrics`;
/// between two upkeeps they take 8 bytes each (one per event, request and commit).
pub const METRICS_UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Installs the Prometheus recorder once per process and returns its handle.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let latency_buckets = [
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0,
            ];
            let tick_buckets = [
                0.000_005, 0.00001, 0.000_025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005,
                0.01, 0.05,
            ];
            // Webhook attempts are network round trips bounded by a timeout of up to minutes.
            let webhook_buckets = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(WHEEL_TICK_SECONDS.into()), &tick_buckets)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(WEBHOOK_DELIVERY_SECONDS.into()),
                        &webhook_buckets,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency_buckets)
                })
                .map(|b| b.build_recorder());
            let recorder = match recorder {
                Ok(r) => r,
                Err(_) => PrometheusBuilder::new().build_recorder(),
            };
            let handle = recorder.handle();
            // A histogram's samples wait in the recorder, 8 bytes each, until they are folded
            // into its buckets: by a scrape, or by this upkeep. Without it a service nobody
            // scrapes grows by a sample per event and per request, without bound.
            let upkeep = handle.clone();
            if let Err(e) = std::thread::Builder::new()
                .name("geodwell-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(METRICS_UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                })
            {
                tracing::warn!(error = %e, "the metrics upkeep thread did not start; histogram samples are folded only when /metrics is scraped");
            }
            // Another recorder may already be installed (e.g. by an embedding program); then our
            // handle renders only what it sees, which is still correct for our own metrics.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            // Exported from the start, so dashboards and alerts see 0 rather than no series.
            for reason in ["missing", "invalid", "forbidden"] {
                metrics::counter!(AUTH_FAILURES, "reason" => reason).absolute(0);
            }
            for kind in ["header", "body", "write"] {
                metrics::counter!(HTTP_TIMEOUTS, "kind" => kind).absolute(0);
            }
            for reason in ["delete", "idle"] {
                metrics::counter!(DEVICES_REMOVED, "reason" => reason).absolute(0);
            }
            for stream in ["input", "events"] {
                metrics::counter!(CLUSTER_LEADER_ELECTIONS, "stream" => stream).absolute(0);
            }
            metrics::gauge!(
                BUILD_INFO,
                "version" => env!("CARGO_PKG_VERSION"),
                "profile" => if cfg!(debug_assertions) { "debug" } else { "release" }
            )
            .set(1.0);
            process_collector().describe();
            process_collector().collect();
            for reason in geodwell_core::engine::LateReason::ALL {
                metrics::counter!(FIXES_LATE, "reason" => reason.as_str()).absolute(0);
            }
            for c in [
                FIXES_DUPLICATE,
                STORE_COMMITS,
                STORE_COMMIT_FAILURES,
                SUBSCRIBERS_LAGGED,
                SUBSCRIBER_EVENTS_SENT,
                HTTP_CONNECTIONS_ACCEPTED,
                HTTP_CONNECTIONS_EVICTED,
                HTTP_CONNECTIONS_REFUSED,
                HTTP_ACCEPT_ERRORS,
                HTTP_ORIGIN_REFUSED,
                INGEST_BUDGET_REFUSED,
                OUTBOUND_REFUSED,
                MQTT_MESSAGES,
                STORE_LOG_APPENDED_BYTES,
                STORE_CHECKPOINTS,
                STORE_CHECKPOINT_FAILURES,
                STORE_APPLY_FAILURES,
                CLUSTER_TAKEOVERS,
                CLUSTER_LEASES_LOST,
                CLUSTER_LEASES_RECLAIMED,
                CLUSTER_INPUT_STALLS,
                CLUSTER_INPUT_BRIDGED,
                CLUSTER_PARTITION_FAILURES,
                CLUSTER_CHECKPOINTS,
                CLUSTER_CHECKPOINT_FAILURES,
                CLUSTER_PUBLISH_RETRIES,
                CLUSTER_FENCED_PUBLISHES,
                CLUSTER_EVENTS_SUPPRESSED,
                CLUSTER_TICKS,
                CLUSTER_INGEST_FAILURES,
                CLUSTER_OUTCOMES_UNCONFIRMED,
                CLUSTER_FENCE_WRITES,
                CLUSTER_FENCE_COMPACTIONS,
                CLUSTER_FEED_SKIPPED,
                CLUSTER_LAG_REFUSED,
            ] {
                metrics::counter!(c).absolute(0);
            }
            for g in [
                CLUSTER_PARTITIONS_OWNED,
                CLUSTER_NODES,
                CLUSTER_LAG_RECORDS,
                CLUSTER_CHECKPOINT_AGE_MAX_SECONDS,
                STORE_CHECKPOINT_DEVICES,
                STORE_CHECKPOINT_BYTES,
                STORE_CHECKPOINT_AGE_SECONDS,
                STORE_CHECKPOINT_SORT_BUFFER_BYTES,
                STORE_JOURNAL_BYTES,
                STORE_APPLY_BACKLOG_BYTES,
            ] {
                metrics::gauge!(g).set(0.0);
            }
            // Histograms are exported once registered, empty until their first sample.
            for h in [
                STORE_CHECKPOINT_SECONDS,
                STORE_APPLY_SECONDS,
                CLUSTER_CHECKPOINT_SECONDS,
                CLUSTER_PUBLISH_SECONDS,
                CLUSTER_INGEST_ACK_SECONDS,
            ] {
                let _ = metrics::histogram!(h);
            }
            for phase in ["restore", "suppress", "replay"] {
                let _ = metrics::histogram!(CLUSTER_TAKEOVER_SECONDS, "phase" => phase);
            }
            handle
        })
        .clone()
}

fn describe() {
    describe_gauge!(
        BUILD_INFO,
        "Always 1: the binary's version and build profile as labels."
    );
    describe_counter!(FIXES_RECEIVED, "Fixes received, by transport.");
    describe_counter!(FIXES_REJECTED, "Fixes rejected, by reason.");
    describe_counter!(
        FIXES_LATE,
        "Late fixes, counted and not applied, by reason: too_old (more than time.max_delay behind the watermark) or behind_device (at or before the device's frontier)."
    );
    describe_histogram!(
        FIX_ARRIVAL_DELAY,
        Unit::Seconds,
        "How long after its own ts a fix arrived (wall clock minus ts, live clock only; 0 for a fix from the future)."
    );
    describe_counter!(FIXES_DUPLICATE, "Duplicate fixes: counted, not applied.");
    describe_counter!(EVENTS_EMITTED, "Events emitted, by type.");
    describe_gauge!(PAIRS_LIVE, "Live device-fence pair records, by shard.");
    describe_gauge!(DEVICES, "Devices known, by shard.");
    describe_counter!(
        DEVICES_REMOVED,
        "Devices removed, by reason: delete (DELETE /v1/devices/{id}) or idle (devices.idle_ttl)."
    );
    describe_gauge!(FIXES_BUFFERED, "Fixes waiting for the watermark, by shard.");
    describe_gauge!(WHEEL_TIMERS_LIVE, "Live timer-wheel entries, by shard.");
    describe_gauge!(
        WHEEL_TOMBSTONES,
        "Cancelled wheel entries not yet dropped, by shard."
    );
    describe_gauge!(
        WHEEL_CARRY,
        "Due timers carried to the next tick by the fire cap."
    );
    describe_histogram!(WHEEL_TICK_SECONDS, Unit::Seconds, "Driver tick duration.");
    describe_histogram!(
        INGEST_TO_EVENT_SECONDS,
        Unit::Seconds,
        "Per event, to its publication: for an ENTER or EXIT from the arrival of the fix that decided it (its wait in the reorder buffer included); for a DWELL from the arrival of the batch whose step fired it or, fired by time alone, from the moment the watermark passed its deadline (live: wall clock at deadline + lateness). One process; a cluster node records none."
    );
    describe_gauge!(
        WATERMARK_LAG_SECONDS,
        Unit::Seconds,
        "Wall clock minus watermark."
    );
    describe_gauge!(SUBSCRIBERS, "Connected event subscribers.");
    describe_counter!(SUBSCRIBERS_LAGGED, "Subscribers closed for falling behind.");
    describe_counter!(SUBSCRIBER_EVENTS_SENT, "Events sent to subscribers.");
    describe_counter!(
        AUTH_FAILURES,
        "Requests refused for a missing or invalid API key or a missing scope."
    );
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests, by matched route, method and status."
    );
    describe_histogram!(
        HTTP_REQUEST_SECONDS,
        Unit::Seconds,
        "HTTP request duration."
    );
    describe_gauge!(
        HTTP_CONNECTIONS,
        "Open client connections (WebSockets included)."
    );
    describe_gauge!(
        HTTP_CONNECTIONS_MAX,
        "Open client connections allowed (server.max_connections, resolved at start)."
    );
    describe_counter!(HTTP_CONNECTIONS_ACCEPTED, "Client connections accepted.");
    describe_counter!(
        HTTP_CONNECTIONS_EVICTED,
        "Connections asked to close to make room at the connection limit (the oldest speaking HTTP)."
    );
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        "Connections refused at the limit because every open one was a WebSocket."
    );
    describe_counter!(
        HTTP_ACCEPT_ERRORS,
        "Failed accepts (e.g. out of file descriptors)."
    );
    describe_counter!(
        HTTP_TIMEOUTS,
        "Connections or requests ended by a timeout: header (request head, idle keep-alive), body, write."
    );
    describe_counter!(
        HTTP_ORIGIN_REFUSED,
        "Requests refused because the page's origin is not allowed (server.cors_origins)."
    );
    describe_gauge!(
        INGEST_QUEUED_BYTES,
        Unit::Bytes,
        "Bytes of queued input (bodies, frames, batches waiting for the shards) held in the memory budget."
    );
    describe_gauge!(
        INGEST_QUEUED_BYTES_MAX,
        Unit::Bytes,
        "The memory budget for queued input (ingest.max_queued_bytes, resolved at start)."
    );
    describe_counter!(
        INGEST_BUDGET_REFUSED,
        "Requests and frames answered 503 because the memory budget was in use."
    );
    describe_gauge!(DEVICES_MAX, "Most devices held (ingest.max_devices).");
    describe_gauge!(
        SUBSCRIBERS_MAX,
        "Most event subscribers at once (events.max_subscribers)."
    );
    describe_counter!(
        OUTBOUND_REFUSED,
        "Outgoing connections (webhook deliveries, MQTT and NATS sinks) refused because the target is not a public address."
    );
    describe_gauge!(
        TLS_CERT_EXPIRY,
        Unit::Seconds,
        "End of validity of the HTTP server's TLS certificate (the leaf in use), Unix seconds; alert well before it."
    );
    describe_gauge!(
        MQTT_CONNECTED,
        "Whether the MQTT ingest connection is up (1) or not (0)."
    );
    describe_counter!(
        MQTT_CONNECTS,
        "MQTT ingest connection attempts, by outcome (connected, refused, failed)."
    );
    describe_gauge!(
        MQTT_QUEUED,
        "MQTT messages read from the broker and not yet acknowledged (held in the ingest memory budget)."
    );
    describe_counter!(
        MQTT_MESSAGES,
        "MQTT messages read by ingest; each is acknowledged to the broker once its fixes are durable."
    );
    describe_gauge!(EVENT_LOG_EVENTS, "Events held in the event log.");
    describe_gauge!(FENCES, "Fences loaded.");
    describe_histogram!(
        STORE_COMMIT_SECONDS,
        Unit::Seconds,
        "State store commit duration."
    );
    describe_counter!(STORE_COMMITS, "State store commits.");
    describe_counter!(
        STORE_LOG_APPENDED_BYTES,
        Unit::Bytes,
        "Bytes of input records appended to the input log."
    );
    describe_gauge!(
        STORE_LOG_BYTES,
        Unit::Bytes,
        "Size of the live store file: the input log since the last checkpoint, events, cursors (updated at each scrape)."
    );
    describe_counter!(STORE_CHECKPOINTS, "Checkpoints written.");
    describe_counter!(
        STORE_CHECKPOINT_FAILURES,
        "Checkpoints that could not be written (the previous one stays; the next writes every device)."
    );
    describe_histogram!(
        STORE_CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Duration of one checkpoint round, from its start to its commit."
    );
    describe_gauge!(
        STORE_CHECKPOINT_DEVICES,
        "Devices written by the last checkpoint (those changed since the one before)."
    );
    describe_gauge!(
        STORE_CHECKPOINT_BYTES,
        Unit::Bytes,
        "Size of the checkpoint file."
    );
    describe_gauge!(
        STORE_CHECKPOINT_AGE_SECONDS,
        Unit::Seconds,
        "Seconds since the last checkpoint committed (updated at each scrape)."
    );
    describe_gauge!(
        STORE_CHECKPOINT_SORT_BUFFER_BYTES,
        Unit::Bytes,
        "Memory held by the checkpoint writer's sort buffer while a round is written (bounded: 8 MiB of records plus one, and 4 bytes per record held; 0 between rounds)."
    );
    describe_counter!(
        STORE_COMMIT_FAILURES,
        "Failed state store commits (data kept, retried)."
    );
    describe_gauge!(
        STORE_JOURNAL_BYTES,
        Unit::Bytes,
        "Size of the store's journal: commits not yet known to be in the live file (a segment is removed once it is)."
    );
    describe_gauge!(
        STORE_APPLY_BACKLOG_BYTES,
        Unit::Bytes,
        "Journaled commits held in memory until they are written into the live store file (bounded: 256 MiB)."
    );
    describe_histogram!(
        STORE_APPLY_SECONDS,
        Unit::Seconds,
        "Duration of one background transaction writing journaled commits into the live store file."
    );
    describe_counter!(
        STORE_APPLY_FAILURES,
        "Background transactions into the live store file that failed (the commits stay in the journal and are retried)."
    );
    describe_counter!(
        WEBHOOK_SENT,
        "Events delivered to a webhook receiver (2xx), by sink."
    );
    describe_counter!(WEBHOOK_FAILED, "Failed webhook attempts, by sink.");
    describe_counter!(
        WEBHOOK_RETRIES,
        "Webhook attempts after an event's first, by sink."
    );
    describe_counter!(
        WEBHOOK_DEAD_LETTERED,
        "Events dead-lettered after max_attempts, by sink."
    );
    describe_counter!(
        WEBHOOK_DROPPED,
        "Events lost to retention before a lagging webhook sink processed them, by sink."
    );
    describe_gauge!(
        WEBHOOK_LAG_EVENTS,
        "Events published but not yet processed by a webhook sink, by sink."
    );
    describe_histogram!(
        WEBHOOK_DELIVERY_SECONDS,
        Unit::Seconds,
        "Duration of one webhook attempt, by sink."
    );
    describe_gauge!(
        WEBHOOK_SUBJECT_CACHE,
        "Subjects a NATS sink's connection remembers as held by a JetStream stream or not (bounded: 1,024, each trusted 30 s), by sink."
    );
    describe_cluster();
}

fn describe_cluster() {
    describe_gauge!(
        CLUSTER_PARTITIONS_OWNED,
        "Partitions this node owns (cluster mode; 0 otherwise)."
    );
    describe_gauge!(CLUSTER_NODES, "Live cluster nodes this node sees.");
    describe_counter!(
        CLUSTER_LAG_REFUSED,
        "Batches refused (503 overloaded) because a partition they touch lags more than ingest.shard_queue records."
    );
    describe_gauge!(
        CLUSTER_LAG_RECORDS,
        "Input records not applied yet, summed over the partitions this node owns."
    );
    describe_gauge!(
        CLUSTER_CHECKPOINT_AGE_MAX_SECONDS,
        Unit::Seconds,
        "Seconds since the least recently checkpointed partition owned here last checkpointed (0: none owned)."
    );
    describe_histogram!(
        CLUSTER_INGEST_ACK_SECONDS,
        Unit::Seconds,
        "One ingest batch part, from its publish to the input stream's acknowledgement (PubAck)."
    );
    describe_counter!(CLUSTER_TAKEOVERS, "Partitions this node has taken over.");
    describe_counter!(
        CLUSTER_LEADER_ELECTIONS,
        "Leader elections of the input (stream=input) and events (stream=events) streams this node heard of; each makes the stream's readers re-create their consumers."
    );
    describe_histogram!(
        CLUSTER_TAKEOVER_SECONDS,
        Unit::Seconds,
        "Takeover phases: restore (checkpoint), suppress (what was published), replay (input after the checkpoint)."
    );
    describe_counter!(
        CLUSTER_LEASES_LOST,
        "Partition leases this node found taken by another (it stood down)."
    );
    describe_counter!(
        CLUSTER_LEASES_RECLAIMED,
        "Partition leases that expired under this node's running partition while the lease bucket could not be written, and that it took back (no other owner had checkpointed)."
    );
    describe_counter!(
        CLUSTER_INPUT_STALLS,
        "Partition input consumers that delivered nothing for 5 s while input waited in the stream, and were re-created."
    );
    describe_counter!(
        CLUSTER_INPUT_BRIDGED,
        "Partition input records read from the input stream's leader one by one because re-creating the partition's input consumer took over 500 ms (JetStream's meta leader being elected)."
    );
    describe_counter!(
        CLUSTER_PARTITION_FAILURES,
        "Partition tasks that failed (their lease released for another node)."
    );
    describe_gauge!(
        CLUSTER_PARTITION_LAG,
        "Input records a partition owned here has not applied yet, by partition."
    );
    describe_counter!(CLUSTER_CHECKPOINTS, "Partition checkpoints written.");
    describe_counter!(
        CLUSTER_CHECKPOINT_FAILURES,
        "Partition checkpoints that could not be written (the previous one stays)."
    );
    describe_histogram!(
        CLUSTER_CHECKPOINT_SECONDS,
        Unit::Seconds,
        "From a partition's freeze to its checkpoint pointer moving."
    );
    describe_gauge!(
        CLUSTER_CHECKPOINT_BYTES,
        Unit::Bytes,
        "Size of a partition's newest checkpoint written here, by partition."
    );
    describe_gauge!(
        CLUSTER_CHECKPOINT_AGE_SECONDS,
        Unit::Seconds,
        "Seconds since a partition owned here last checkpointed, by partition."
    );
    describe_histogram!(
        CLUSTER_PUBLISH_SECONDS,
        Unit::Seconds,
        "An event's publish to the events stream, to its PubAck."
    );
    describe_counter!(
        CLUSTER_PUBLISH_RETRIES,
        "Event publishes retried (no answer from the stream)."
    );
    describe_counter!(
        CLUSTER_FENCED_PUBLISHES,
        "Event publishes refused because another owner published on the partition since."
    );
    describe_counter!(
        CLUSTER_EVENTS_SUPPRESSED,
        "Events a takeover's replay produced again and did not publish twice."
    );
    describe_counter!(
        CLUSTER_TICKS,
        "Watermark ticks written into partition inputs."
    );
    describe_counter!(
        CLUSTER_INGEST_FAILURES,
        "Batch parts the partition input did not acknowledge (the batch answered 503)."
    );
    describe_counter!(
        CLUSTER_OUTCOMES_UNCONFIRMED,
        "Fixes answered accepted without their owner's verdict (it was being taken over)."
    );
    describe_counter!(CLUSTER_FENCE_WRITES, "Fence writes made from this node.");
    describe_counter!(
        CLUSTER_FENCE_COMPACTIONS,
        "Fence stream compactions made by this node."
    );
    describe_counter!(
        CLUSTER_FEED_SKIPPED,
        "Events this node's log skipped because the events stream no longer held them."
    );
}

/// Sets up `tracing` to stderr, filtered by `GEODWELL_LOG` (default `info`).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("GEODWELL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    /// Histogram samples must not wait for a scrape to be folded: installing the recorder starts
    /// the upkeep thread (Linux cuts thread names to 15 bytes). A new thread names itself once
    /// it runs, so until then it carries its parent's name: the test waits for the name.
    #[test]
    fn install_starts_the_histogram_upkeep() {
        let _ = super::install();
        let threads = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .expect("procfs")
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut names = threads();
        while !names.iter().any(|n| n == "geodwell-metric") {
            assert!(
                std::time::Instant::now() < deadline,
                "no upkeep thread among {names:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
            names = threads();
        }
    }
}
