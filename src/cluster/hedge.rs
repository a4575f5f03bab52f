//! Hedged JetStream API requests: a request that may never be answered is sent again after a
//! short wait while the first is still in flight, and the first answer wins.
//!
//! Why: JetStream places a single-replica (ordered) consumer on one of the stream's servers. Right
//! after a server is lost, the meta leader can still place a new consumer on it (it has not
//! marked the server offline yet), and that creation is never answered; about a quarter of the
//! input consumers re-created after an input stream election were, in `benches/cluster.sh`'s
//! NATS kill. Waiting out a try's timeout before the next one made those partitions' events
//! stall for seconds after the stream had a leader; a hedged try costs [`EVERY`].
//!
//! Invariant: at most [`IN_FLIGHT`] tries are outstanding; a try that loses the race is dropped
//! (an ordered consumer it made is removed by the server once inactive); a try is dropped
//! after [`TRY_FOR`] without an answer, which frees its place for a new one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

/// How long a try goes unanswered before the next one is sent beside it.
pub const EVERY: Duration = Duration::from_millis(250);

/// Tries outstanding at most.
pub const IN_FLIGHT: usize = 4;

/// How long one try may stay unanswered before it is dropped and its place taken by a new one.
pub const TRY_FOR: Duration = Duration::from_secs(2);

/// Why a hedged request failed.
#[derive(Debug, thiserror::Error)]
pub enum Hedged<E: std::error::Error + 'static> {
    /// The last try that was answered failed.
    #[error(transparent)]
    Failed(E),
    /// No try was answered within [`TRY_FOR`].
    #[error("no answer within {TRY_FOR:?} to any of {0} tries")]
    Unanswered(usize),
}

/// Runs `attempt` until one try succeeds or `tries` tries have failed or gone unanswered for
/// [`TRY_FOR`]. Tries start [`EVERY`] apart, whether the one before is unanswered or failed,
/// with at most [`IN_FLIGHT`] outstanding: a server that refuses at once is not hammered.
pub async fn hedged<T, E, F, Fut>(tries: usize, mut attempt: F) -> Result<T, Hedged<E>>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    type Try<Fut> = Pin<Box<tokio::time::Timeout<Fut>>>;
    let mut flying: FuturesUnordered<Try<Fut>> = FuturesUnordered::new();
    let (mut started, mut last) = (0, None);
    let mut next_start = Instant::now();
    loop {
        let can_start = started < tries && flying.len() < IN_FLIGHT;
        if can_start && Instant::now() >= next_start {
            flying.push(Box::pin(tokio::time::timeout(TRY_FOR, attempt())));
            started += 1;
            next_start = Instant::now() + EVERY;
            continue;
        }
        if started >= tries && flying.is_empty() {
            return Err(last.map_or(Hedged::Unanswered(tries), Hedged::Failed));
        }
        let next = if !can_start {
            flying.next().await
        } else if flying.is_empty() {
            tokio::time::sleep_until(next_start).await;
            continue;
        } else {
            match tokio::time::timeout_at(next_start, flying.next()).await {
                Ok(next) => next,
                // Time for the next try, beside those unanswered.
                Err(_) => continue,
            }
        };
        match next {
            Some(Ok(Ok(v))) => return Ok(v),
            Some(Ok(Err(e))) => last = Some(e),
            Some(Err(_)) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_try_is_hedged_and_the_first_answer_wins() {
        let n = Arc::new(AtomicUsize::new(0));
        let t0 = tokio::time::Instant::now();
        let got = hedged(10, || {
            let k = n.fetch_add(1, Ordering::SeqCst);
            async move {
                if k < 2 {
                    // Never answered (within the test).
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<usize, std::fmt::Error>(k)
            }
        })
        .await;
        assert_eq!(got.ok(), Some(2));
        assert_eq!(
            t0.elapsed(),
            EVERY * 2,
            "the third try went out after two waits"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_tries_are_paced_and_the_last_error_returned() {
        let n = Arc::new(AtomicUsize::new(0));
        let t0 = tokio::time::Instant::now();
        let got = hedged(3, || {
            n.fetch_add(1, Ordering::SeqCst);
            async move { Err::<(), _>(std::fmt::Error) }
        })
        .await;
        assert!(matches!(got, Err(Hedged::Failed(std::fmt::Error))));
        assert_eq!(t0.elapsed(), EVERY * 2);
        assert_eq!(n.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_in_flight_tries_are_outstanding_and_an_unanswered_one_is_replaced() {
        let n = Arc::new(AtomicUsize::new(0));
        let f = hedged(100, || {
            n.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<(), std::fmt::Error>(())
            }
        });
        let _ = tokio::time::timeout(TRY_FOR - Duration::from_millis(1), f).await;
        assert_eq!(n.load(Ordering::SeqCst), IN_FLIGHT);
        let n2 = Arc::new(AtomicUsize::new(0));
        let t0 = tokio::time::Instant::now();
        let got = hedged(6, || {
            n2.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<(), std::fmt::Error>(())
            }
        })
        .await;
        assert!(matches!(got, Err(Hedged::Unanswered(6))));
        assert_eq!(n2.load(Ordering::SeqCst), 6);
        // Tries at 0, 0.25, 0.5, 0.75 s, then one as each of the first two is dropped; the
        // last is dropped 2 s after it went out.
        assert_eq!(t0.elapsed(), TRY_FOR + EVERY + TRY_FOR);
    }
}
