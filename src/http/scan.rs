//! Where the work a read request triggers runs: scans of the event log and matches over the
//! fences (a filtered poll, a device's visits, a fence query by place) run on the blocking pool,
//! at most [`SCAN_SLOTS`] at once, never on the runtime's worker threads, which serve ingest and
//! every other request. Each scan is also bounded per page by its caller, so a slot is held for
//! milliseconds; requests beyond the slots wait their turn without holding a thread.

use tokio::sync::Semaphore;

use crate::http::error::ApiError;

/// Scans that may run at once.
pub const SCAN_SLOTS: usize = 2;

static SLOTS: Semaphore = Semaphore::const_new(SCAN_SLOTS);

/// Runs `work` on the blocking pool once a slot is free.
pub async fn run<T, F>(work: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let _slot = SLOTS
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the scan slots are closed"))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("a scan failed: {e}")))
}
