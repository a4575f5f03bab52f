//! The simulator's error type: why a run (or `geodwell simulate`) did not end cleanly.
//!
//! Invariants:
//! - No variant holds the API key: messages say what the server made of it (missing, not
//!   valid, lacking a scope), never its value.
//! - Every message says what to do when there is something to do (a flag, a scope), since it is
//!   what the user of `geodwell simulate` reads on stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Why a run stopped, could not start, or ended with fixes the server did not take.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The server could not be reached or answered unexpectedly.
    #[error("server {url}: {message}")]
    Server {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The server refused the request's API key: 401 (none, or not valid) or 403 (it lacks the
    /// route's scope). Nothing else in the run can succeed, so it stops at the first one.
    #[error("{}", refusal_text(*status, *key_sent, request, detail))]
    Refused {
        /// 401 or 403.
        status: u16,
        /// What was refused, e.g. `POST /v1/fixes`.
        request: String,
        /// The server's own message (its error JSON's `message`), or the status text.
        detail: String,
        /// Whether the request carried a key.
        key_sent: bool,
    },
    /// The run finished, but the server did not take some fixes: answers other than 2xx (after
    /// the 429 / 503 retries), items it rejected, batches lost on the way. The report is still
    /// complete; this only makes the exit status say so.
    #[error("{}", fixes_refused_text(*refused, *sent, *rejected, errors))]
    FixesRefused {
        /// Fixes rejected item by item plus fixes in failed batches.
        refused: u64,
        /// Fixes sent.
        sent: u64,
        /// Of `refused`, those rejected item by item (in 2xx answers).
        rejected: u64,
        /// Fixes lost to whole-batch errors, by status or error code (the report's `errors`).
        errors: BTreeMap<String, u64>,
    },
    /// The fleet could not be built.
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    /// The options contradict each other.
    #[error("bad options: {0}")]
    Options(String),
    /// A file could not be read or written.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// `read`, `write` or `create`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The fences file is not valid GeoJSON fences.
    #[error("{}: {message}", path.display())]
    Fences {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        message: String,
    },
    /// A value could not be encoded as JSON.
    #[error("cannot encode JSON")]
    Json(#[from] serde_json::Error),
}

impl SimError {
    /// A [`SimError::Server`] for `url`.
    pub(crate) fn server(url: &str, e: impl std::fmt::Display) -> SimError {
        SimError::Server {
            url: url.to_string(),
            message: e.to_string(),
        }
    }

    /// A [`SimError::Refused`] from a 401 / 403 answer to `request` with body `body` (the
    /// server's error JSON, whose `message` is kept; anything else is summarized by `status`).
    pub(crate) fn refused(status: u16, request: &str, body: &[u8], key_sent: bool) -> SimError {
        let detail = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| {
                if status == 401 {
                    "unauthorized".into()
                } else {
                    "forbidden".into()
                }
            });
        SimError::Refused {
            status,
            request: request.to_string(),
            detail,
            key_sent,
        }
    }

    /// A [`SimError::Io`].
    pub(crate) fn io(action: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        SimError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether an HTTP status is an authentication refusal that stops the run.
pub(crate) fn is_auth_refusal(status: u16) -> bool {
    status == 401 || status == 403
}

fn refusal_text(status: u16, key_sent: bool, request: &str, detail: &str) -> String {
    match (status, key_sent) {
        (401, false) => format!(
            "the server refused the request without an API key ({status} at {request}: \
             {detail}): pass --api-key KEY or set GEODWELL_API_KEY"
        ),
        (401, true) => format!(
            "the server refused the API key ({status} at {request}: {detail}): check the key \
             given with --api-key or GEODWELL_API_KEY"
        ),
        _ => format!(
            "the server refused the API key ({status} at {request}: {detail}): the simulator \
             needs a key with the ingest scope to send fixes, read to subscribe to events (or \
             pass --no-measure) and admin to upload fences (or pass --no-upload)"
        ),
    }
}

fn fixes_refused_text(
    refused: u64,
    sent: u64,
    rejected: u64,
    errors: &BTreeMap<String, u64>,
) -> String {
    let mut parts = Vec::new();
    if rejected > 0 {
        parts.push(format!("{rejected} rejected item by item"));
    }
    if !errors.is_empty() {
        let lost: u64 = errors.values().sum();
        let by: Vec<String> = errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        parts.push(format!(
            "{lost} in failed batches or connections ({})",
            by.join(", ")
        ));
    }
    format!(
        "{refused} of {sent} fixes sent were refused or lost: {}",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_to_do_and_keep_the_servers_message() {
        let body =
            br#"{"error":{"code":"unauthorized","message":"this endpoint needs an API key"}}"#;
        let e = SimError::refused(401, "POST /v1/fences", body, false).to_string();
        assert!(e.contains("401 at POST /v1/fences"), "{e}");
        assert!(e.contains("this endpoint needs an API key"), "{e}");
        assert!(
            e.contains("--api-key") && e.contains("GEODWELL_API_KEY"),
            "{e}"
        );
        let e = SimError::refused(403, "POST /v1/fixes", b"not json", true).to_string();
        assert!(e.contains("403 at POST /v1/fixes: forbidden"), "{e}");
        assert!(e.contains("ingest scope"), "{e}");
    }

    #[test]
    fn refused_fixes_are_counted_in_the_message() {
        let errors = BTreeMap::from([("413".to_string(), 900u64), ("connect".into(), 100)]);
        let e = SimError::FixesRefused {
            refused: 1003,
            sent: 5000,
            rejected: 3,
            errors,
        }
        .to_string();
        assert_eq!(
            e,
            "1003 of 5000 fixes sent were refused or lost: 3 rejected item by item; 1000 in \
             failed batches or connections (413: 900, connect: 100)"
        );
    }
}
