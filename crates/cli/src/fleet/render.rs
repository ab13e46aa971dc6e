//! `vigil status --fleet`: the fleet document of `GET /api/fleet` as text.
//! Read from JSON (not the fleet crate's types) so that the command works
//! in a build without the `fleet` feature, against a vigil that has it.

use serde_json::Value;

use crate::client::clock;

/// The fleet as a member sees it: its state, the members, and one line per
/// target with its owners and the origin of its last verdict.
pub(crate) fn render(v: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let ms = |v: &Value| v.as_u64().unwrap_or(0);
    let mut out = format!(
        "fleet {}  member {}  {} since {} UTC  (R={}, ttl {} ms)\n",
        s(&v["fleet"]),
        s(&v["member"]),
        s(&v["state"]),
        clock(ms(&v["since_unix_ms"])),
        v["replicas"].as_u64().unwrap_or(1),
        ms(&v["ttl_ms"]),
    );
    if let Some(r) = v["reason"].as_str() {
        out.push_str(&format!("  why: {r}\n"));
    }
    let members: Vec<String> = v["members"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    out.push_str(&format!(
        "members ({}): {}\n",
        members.len(),
        members.join(", ")
    ));
    let targets = v["targets"].as_array().cloned().unwrap_or_default();
    let width = targets
        .iter()
        .map(|t| s(&t["id"]).len())
        .max()
        .unwrap_or(6)
        .max(6);
    out.push_str(&format!(
        "{:<width$}  {:<5}  {:<20}  LAST VERDICT\n",
        "TARGET", "HERE", "OWNERS"
    ));
    for t in &targets {
        let owners: Vec<String> = t["owners"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default();
        let last = &t["last"];
        let verdict = if last.is_object() {
            format!(
                "{} by {} at {}: {}",
                if last["ok"].as_bool() == Some(true) {
                    "pass"
                } else {
                    "FAIL"
                },
                s(&last["member"]),
                clock(ms(&last["at_unix_ms"])),
                s(&last["detail"])
            )
        } else {
            "none yet".into()
        };
        out.push_str(&format!(
            "{:<width$}  {:<5}  {:<20}  {verdict}\n",
            s(&t["id"]),
            if t["probed_here"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            owners.join(","),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_verdict_names_its_member() {
        let v: Value = serde_json::from_str(
            r#"{"fleet":"edge","member":"m1","state":"joined","since_unix_ms":3600000,"replicas":1,"ttl_ms":5000,
                "members":["m1","m2"],"history":[],
                "targets":[{"id":"http-127.0.0.1:80-00000000","owners":["m2"],"probed_here":false,
                            "last":{"member":"m2","ok":false,"detail":"HTTP 500","at_unix_ms":3661000}}]}"#,
        )
        .expect("test step");
        let text = render(&v);
        assert!(
            text.starts_with("fleet edge  member m1  joined since 01:00:00 UTC"),
            "{text}"
        );
        assert!(text.contains("members (2): m1, m2"), "{text}");
        assert!(
            text.contains("http-127.0.0.1:80-00000000  no     m2                    FAIL by m2 at 01:01:01: HTTP 500"),
            "{text}"
        );
    }
}
