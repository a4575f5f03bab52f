//! Why the service could not start, or stopped with an error: one enum with the failing part's
//! own error as its source.

use thiserror::Error;

use crate::boot::BootError;
use crate::webhooks::WebhookError;

/// Why the service could not start, or stopped with an error.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// The warm start failed (nothing was served).
    #[error(transparent)]
    Boot(#[from] BootError),
    /// The webhook sinks could not be restored.
    #[error("webhooks")]
    Webhooks(#[source] WebhookError),
    /// The preloaded fences could not be stored.
    #[error("cannot store the preloaded fences")]
    Seed(#[source] crate::fences::FenceWriteError),
    /// The listener failed.
    #[error("server")]
    Io(#[from] std::io::Error),
    /// The warm start task panicked or was cancelled.
    #[error("the warm start did not finish")]
    Join(#[source] tokio::task::JoinError),
    /// The serve task panicked or was cancelled.
    #[error("the service task did not finish")]
    Stopped(#[source] tokio::task::JoinError),
    /// The TLS certificate or key cannot be used.
    #[error("TLS")]
    Tls(#[source] crate::http::tls::TlsError),
    /// The cluster node could not start (NATS unreachable, or its streams not usable).
    #[error("cluster")]
    Cluster(#[source] crate::cluster::NatsError),
}
