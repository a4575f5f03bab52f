//! Topic and subject templates of MQTT and NATS sinks: where a template comes from in a sink's
//! URL, what it may hold, and how an event fills it. Pure: no I/O.
//!
//! Invariants: a checked template has no wildcard and only known placeholders; filling it makes
//! exactly one topic level (subject token) per placeholder, inserts each value as text in one
//! pass (a value is never read for placeholders again), and never puts a character there that
//! the destination reserves or a broker refuses.

/// How a sink's events leave: chosen by its URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// `http://` / `https://`: a signed POST per event (Standard Webhooks).
    Http,
    /// `mqtt://` / `mqtts://host[:port]/<topic template>`: a QoS 1 PUBLISH per event.
    Mqtt,
    /// `nats://host[:port]/<subject template>`: a JetStream publish (`Nats-Msg-Id` = event id)
    /// when a stream holds the subject, else a core publish.
    Nats,
}

/// The placeholders a topic or subject template may hold, filled from the event.
pub const PLACEHOLDERS: &[&str] = &["{fence}", "{type}", "{device}"];

/// The topic or subject template of an MQTT or NATS URL: its path without the leading `/`,
/// percent-decoded (so `{fence}` may be written as is or escaped).
pub fn destination_template(u: &reqwest::Url) -> String {
    let path = u.path().strip_prefix('/').unwrap_or(u.path());
    crate::wire::trackers::percent_decode(path, false)
}

/// Checks a topic (MQTT) or subject (NATS) template: not empty, at most 200 bytes, no
/// wildcards, placeholders only from [`PLACEHOLDERS`]; a NATS subject has no empty token.
pub(crate) fn check_template(kind: SinkKind, t: &str) -> Result<(), String> {
    let what = if kind == SinkKind::Mqtt {
        "topic"
    } else {
        "subject"
    };
    if t.is_empty() {
        return Err(format!(
            "the URL's path is the {what} to publish to and must not be empty \
             (e.g. mqtt://broker:1883/geodwell/events/{{fence}}/{{type}})"
        ));
    }
    if t.len() > 200 {
        return Err(format!("the {what} template must be at most 200 bytes"));
    }
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("unclosed '{{' in the {what} template {t:?}"));
        };
        let ph = &rest[open..open + close + 1];
        if !PLACEHOLDERS.contains(&ph) {
            return Err(format!(
                "unknown placeholder {ph} in the {what} template; known: {}",
                PLACEHOLDERS.join(", ")
            ));
        }
        rest = &rest[open + close + 1..];
    }
    let bad: &[char] = if kind == SinkKind::Mqtt {
        &['+', '#', '\0']
    } else {
        &['*', '>', ' ', '\t', '\r', '\n']
    };
    if let Some(c) = t.chars().find(|c| bad.contains(c)) {
        return Err(format!(
            "the {what} template must not contain {c:?} (a wildcard or a separator)"
        ));
    }
    if kind == SinkKind::Nats && t.split('.').any(str::is_empty) {
        return Err(format!("the subject template {t:?} has an empty token"));
    }
    Ok(())
}

/// Fills a template with an event's fence, type and device, in one pass over the template: a
/// value is inserted as text and never read for placeholders again (a fence named `zone{device}`
/// stays that). A value's characters that the destination reserves (MQTT: `+`, `#`, `/`; NATS:
/// `.`, `*`, `>`, whitespace) become `_`, so one event always makes one topic level or subject
/// token per placeholder, and so do characters a broker refuses in a topic (control characters
/// and Unicode noncharacters, [`geodwell_core::fix::uncarriable_char`]), which ids stored
/// before they were refused may still hold.
pub fn fill_template(kind: SinkKind, t: &str, fence: &str, kind_str: &str, device: &str) -> String {
    let clean = |v: &str, out: &mut String| {
        let start = out.len();
        for c in v.chars() {
            let reserved = match kind {
                SinkKind::Mqtt => matches!(c, '+' | '#' | '/'),
                _ => matches!(c, '.' | '*' | '>') || c.is_whitespace(),
            };
            let refused = geodwell_core::fix::uncarriable(c);
            out.push(if reserved || refused { '_' } else { c });
        }
        if out.len() == start {
            out.push('_');
        }
    };
    let mut out = String::with_capacity(t.len() + fence.len() + device.len());
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let value = PLACEHOLDERS
            .iter()
            .zip([fence, kind_str, device])
            .find(|(ph, _)| after.starts_with(**ph));
        match value {
            Some((ph, v)) => {
                clean(v, &mut out);
                rest = &after[ph.len()..];
            }
            None => {
                out.push('{');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}
