//! `[mqtt]` checks: the broker URL and the topic filters (pure; used by the loader, so a bad
//! setting stops the start with every problem listed).

/// Checks `[mqtt] url`: `mqtt://` or `mqtts://`, a host, nothing after the port.
pub fn check_broker_url(url: &str) -> Result<(), String> {
    let u = reqwest::Url::parse(url)
        .map_err(|e| format!("not a URL ({e}); expected mqtt://host:1883, got {url:?}"))?;
    if !matches!(u.scheme(), "mqtt" | "mqtts") {
        return Err(format!("must be mqtt:// or mqtts://, got {url:?}"));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(format!("must name a host, got {url:?}"));
    }
    if !matches!(u.path(), "" | "/") || u.query().is_some() || u.fragment().is_some() {
        return Err(format!(
            "must be mqtt://[user:password@]host[:port] with nothing after, got {url:?}"
        ));
    }
    Ok(())
}

/// Checks an MQTT topic filter: 1..=256 bytes, no NUL, `#` only as the whole last level, `+`
/// only as a whole level.
pub fn check_filter(f: &str) -> Result<(), String> {
    if f.is_empty() || f.len() > 256 {
        return Err("a topic filter is 1 to 256 bytes".into());
    }
    if f.contains('\0') {
        return Err("a topic filter must not contain NUL".into());
    }
    let levels: Vec<&str> = f.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            return Err("'#' must be the whole last level of a topic filter".into());
        }
        if l.contains('+') && *l != "+" {
            return Err("'+' must be a whole level of a topic filter".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_filters_are_checked() {
        for ok in ["owntracks/+/+", "a/#", "#", "a/b", "+"] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/#/b", "a#", "a/b+", "x\0"] {
            assert!(check_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn broker_urls_are_checked() {
        for ok in [
            "mqtt://127.0.0.1:1883",
            "mqtts://u:p@broker.example",
            "mqtt://h/",
        ] {
            assert!(check_broker_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://h",
            "mqtt://",
            "mqtt://h/topic",
            "mqtt://h?x=1",
            "nope",
        ] {
            assert!(check_broker_url(bad).is_err(), "{bad}");
        }
    }
}
