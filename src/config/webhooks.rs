//! The `[[webhooks]]` array of a configuration file: each entry is validated by the sink
//! definition's own validator ([`SinkSpec::from_json`]), the one the API uses, and its problems
//! are reported as configuration issues keyed `webhooks[i].field`.

use super::ConfigIssue;
use crate::webhooks::SinkSpec;

/// Validates the `[[webhooks]]` array of a config file (`None`: no webhooks). Problems are keyed
/// `webhooks[i].field`; ids must be unique.
pub fn from_config(raw: Option<&toml::Value>) -> (Vec<SinkSpec>, Vec<ConfigIssue>) {
    let mut sinks = Vec::new();
    let mut issues = Vec::new();
    let Some(raw) = raw else {
        return (sinks, issues);
    };
    let Some(items) = raw.as_array() else {
        issues.push(ConfigIssue {
            key: "webhooks".into(),
            message: "expected an array of tables ([[webhooks]] entries)".into(),
        });
        return (sinks, issues);
    };
    for (i, item) in items.iter().enumerate() {
        let v = match serde_json::to_value(item) {
            Ok(v) => v,
            Err(e) => {
                issues.push(ConfigIssue {
                    key: format!("webhooks[{i}]"),
                    message: e.to_string(),
                });
                continue;
            }
        };
        match SinkSpec::from_json(&v, &[]) {
            Ok(s) if sinks.iter().any(|o: &SinkSpec| o.id == s.id) => issues.push(ConfigIssue {
                key: format!("webhooks[{i}].id"),
                message: format!("duplicate webhook id {:?}", s.id),
            }),
            Ok(s) => sinks.push(s),
            Err(errs) => issues.extend(errs.into_iter().map(|(field, message)| ConfigIssue {
                key: format!("webhooks[{i}].{field}"),
                message,
            })),
        }
    }
    (sinks, issues)
}

#[cfg(test)]
mod tests {
    use super::*;
    use geodwell_core::event::EventKind;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    #[test]
    fn config_array_reports_positions_and_duplicates() {
        let t: toml::Table = toml::from_str(&format!(
            "[[webhooks]]\nid = \"a\"\nurl = \"http://x/\"\nsecret = \"{SECRET}\"\n\
             [[webhooks]]\nid = \"a\"\nurl = \"http://y/\"\nsecret = \"{SECRET}\"\n\
             [[webhooks]]\nid = \"c\"\nurl = 5\nsecret = \"{SECRET}\"\nmax_attempts = 3\n"
        ))
        .unwrap();
        let (sinks, issues) = from_config(t.get("webhooks"));
        assert_eq!(sinks.len(), 1);
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            vec!["webhooks[1].id", "webhooks[2].url"],
            "{issues:?}"
        );
    }

    #[test]
    fn config_webhook_errors_are_reported_with_the_others() {
        use crate::config::Config;
        let env = Default::default();
        let text = format!(
            "[time]\nclock = \"sundial\"\n[[webhooks]]\nid = \"a\"\nurl = \"nope\"\nsecret = \"{SECRET}\"\n"
        );
        let err = Config::load(Some(("t", &text)), &env, 1).unwrap_err();
        let keys: Vec<&str> = err.issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, vec!["time.clock", "webhooks[0].url"], "{err}");
        let err = Config::load(Some(("t", "webhooks = 5\n")), &env, 1).unwrap_err();
        assert_eq!(err.issues[0].key, "webhooks");
        let text = format!(
            "[[webhooks]]\nid = \"a\"\nurl = \"http://h/\"\nsecret = \"{SECRET}\"\ntypes = [\"dwell\"]\n"
        );
        let cfg = Config::load(Some(("t", &text)), &env, 1).unwrap();
        assert_eq!(cfg.webhooks.len(), 1);
        assert_eq!(cfg.webhooks[0].types, vec![EventKind::Dwell]);
        assert!(Config::defaults(1).webhooks.is_empty());
    }
}
