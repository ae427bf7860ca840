//! The Debezium Outbox Event Router's record shapes, for users who move
//! their consumers over unchanged (docs/migrating-from-debezium.md):
//!
//! - `additional_placement`: Debezium's `table.fields.additional.placement`
//!   entries, `column:header[:alias]`, `column:envelope[:alias]`,
//!   `column:partition`;
//! - `payload_format`: the payload as stored (default), or as a JSON string
//!   (what Debezium's default `table.expand.json.payload = false` gives with
//!   Kafka Connect's JsonConverter);
//! - `[outbox.route]`: `route.topic.regex` / `route.topic.replacement`
//!   applied to the aggregate type (Debezium's `route.by.field`).
//!
//! With envelope fields the value is Debezium's envelope: a JSON object with
//! `payload` and one member per field, field values as JSON strings (or null).

use bytes::Bytes;
use regex::Regex;
use serde::Deserialize;

use crate::setting::InvalidSetting as ConfigError;

/// Where an extra column goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A record header named `name`.
    Header { column: String, name: String },
    /// A member `name` of the value's envelope.
    Envelope { column: String, name: String },
    /// The record's partition number (the column's integer value).
    Partition { column: String },
}

/// The entry forms, for error messages.
const FORMS: &str = "column:header[:alias], column:envelope[:alias] or column:partition";

/// Parses `outbox.additional_placement`.
pub(crate) fn parse_placements(entries: &[String]) -> Result<Vec<Placement>, ConfigError> {
    let invalid =
        |entry: &str, why: String| ConfigError::new("outbox.additional_placement", entry, why);
    let mut out: Vec<Placement> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(invalid(
                entry,
                format!("an entry without empty parts: {FORMS}"),
            ));
        }
        let (column, kind, alias) = match parts.as_slice() {
            [column, kind] => (*column, *kind, None),
            [column, kind, alias] => (*column, *kind, Some(*alias)),
            [column] => {
                return Err(invalid(
                    entry,
                    format!("a placement after the column, such as {column}:header: {FORMS}"),
                ));
            }
            _ => {
                return Err(invalid(entry, format!("at most three parts: {FORMS}")));
            }
        };
        let name = alias.unwrap_or(column).to_string();
        let column = column.to_string();
        let placement = match kind {
            "header" => Placement::Header { column, name },
            "envelope" => Placement::Envelope { column, name },
            // An alias after `partition` is accepted and unused.
            "partition" => Placement::Partition { column },
            other => {
                return Err(invalid(
                    entry,
                    format!("{other} is not a placement (header, envelope or partition): {FORMS}"),
                ));
            }
        };
        if let Placement::Envelope { column, name } = &placement {
            if name == "payload" {
                let alias = if column == "payload" {
                    "payload_column"
                } else {
                    column
                };
                return Err(invalid(
                    entry,
                    format!(
                        "payload is the envelope's member for the payload itself: give the \
                         column another member name, such as {column}:envelope:{alias}"
                    ),
                ));
            }
            let taken = out
                .iter()
                .zip(entries)
                .find(|(p, _)| matches!(p, Placement::Envelope { name: n, .. } if n == name));
            if let Some((_, other)) = taken {
                return Err(invalid(
                    entry,
                    format!(
                        "the envelope member {name} is already written by the entry {other}: \
                         each member name at most once; give this column another one, such \
                         as {column}:envelope:{column}"
                    ),
                ));
            }
        }
        if matches!(placement, Placement::Partition { .. })
            && let Some(other) = entries[..i]
                .iter()
                .zip(&out)
                .find_map(|(e, p)| matches!(p, Placement::Partition { .. }).then_some(e))
        {
            return Err(invalid(
                entry,
                format!(
                    "the entry {other} already picks the partition: at most one partition \
                     column; keep {other} or this entry, not both"
                ),
            ));
        }
        out.push(placement);
    }
    Ok(out)
}

/// How the payload column becomes the record value (`outbox.payload_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PayloadFormat {
    /// The column's text exactly as PostgreSQL sends it.
    #[default]
    AsStored,
    /// That text as a JSON string literal (quoted and escaped).
    JsonString,
}

impl std::str::FromStr for PayloadFormat {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<PayloadFormat, ConfigError> {
        let choices = [
            ("as-stored", PayloadFormat::AsStored),
            ("json-string", PayloadFormat::JsonString),
        ];
        crate::setting::one_of("outbox.payload_format", s, &choices)
    }
}

/// The record value for a payload and the envelope fields, if any.
///
/// `payload_is_json`: the column is `json`/`jsonb`, so its text is a JSON
/// document that an envelope can hold as it is.
pub(crate) fn shape_value(
    format: PayloadFormat,
    payload: &Bytes,
    payload_is_json: bool,
    envelope: &[(&str, Option<&[u8]>)],
) -> Result<Bytes, std::str::Utf8Error> {
    if envelope.is_empty() {
        return Ok(match format {
            PayloadFormat::AsStored => payload.clone(),
            PayloadFormat::JsonString => json_string(std::str::from_utf8(payload)?).into(),
        });
    }
    let mut out = String::with_capacity(payload.len() + 32 * envelope.len() + 16);
    out.push_str("{\"payload\":");
    let text = std::str::from_utf8(payload)?;
    if payload_is_json && format == PayloadFormat::AsStored {
        out.push_str(text);
    } else {
        out.push_str(&json_string(text));
    }
    for (name, value) in envelope {
        out.push(',');
        out.push_str(&json_string(name));
        out.push(':');
        match value {
            Some(v) => out.push_str(&json_string(std::str::from_utf8(v)?)),
            None => out.push_str("null"),
        }
    }
    out.push('}');
    Ok(out.into())
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// `[outbox.route]`: Debezium's `route.topic.regex` and
/// `route.topic.replacement` on the aggregate type. Off while `regex` is `""`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteSettings {
    /// Matched against the whole aggregate type; `(?<routedByValue>.*)` is
    /// Debezium's default. Default `""`: routing by `outbox.topic`.
    pub regex: String,
    /// The topic, with `${name}` / `$1` for the regex's groups, in Java's
    /// syntax as Debezium reads it (`$1_events` is group 1 then `_events`,
    /// `\$` a literal `$`); Debezium's default is `outbox.event.${routedByValue}`.
    pub replacement: String,
}

impl Default for RouteSettings {
    fn default() -> RouteSettings {
        RouteSettings {
            regex: String::new(),
            replacement: "outbox.event.${routedByValue}".to_owned(),
        }
    }
}

/// A compiled `[outbox.route]`.
#[derive(Debug, Clone)]
pub(crate) struct TopicRoute {
    regex: Regex,
    replacement: String,
}

impl RouteSettings {
    /// `None` when routing is by `outbox.topic`.
    pub(crate) fn compile(&self) -> Result<Option<TopicRoute>, ConfigError> {
        if self.regex.is_empty() {
            return Ok(None);
        }
        // Anchored: Debezium matches the whole value.
        let regex = Regex::new(&format!("^(?:{})$", self.regex)).map_err(|e| {
            ConfigError::new(
                "outbox.route.regex",
                &self.regex,
                format!(
                    "a regular expression matched against the whole aggregate type, such \
                     as Debezium's default (?<routedByValue>.*); this one does not compile: {e}"
                ),
            )
        })?;
        if self.replacement.is_empty() {
            return Err(ConfigError::new(
                "outbox.route.replacement",
                "",
                "a topic such as outbox.event.${routedByValue}",
            ));
        }
        let replacement = java_replacement(&self.replacement, &regex).map_err(|why| {
            ConfigError::new(
                "outbox.route.replacement",
                &self.replacement,
                format!(
                    "Java's replacement syntax, as Debezium reads it ($1 or ${{name}} for a \
                     group of outbox.route.regex, \\$ for a literal $): {why}"
                ),
            )
        })?;
        Ok(Some(TopicRoute { regex, replacement }))
    }
}

/// Debezium's replacement, which Java's `Matcher.appendReplacement` reads,
/// as the template `regex::Captures::expand` reads (what the two differ in
/// would route elsewhere: Rust takes `$1_events` as a group named
/// `1_events`). Java: `\` makes the next character literal; `$` is followed
/// by `{name}` or by digits, the first always part of the number and each
/// further one only while the number still names a group (`$12` with one
/// group is group 1, then `2`). A reference to a group the regex lacks is
/// an error in Java too, here at startup.
fn java_replacement(java: &str, regex: &Regex) -> Result<String, String> {
    let groups = regex.captures_len() - 1;
    let mut out = String::with_capacity(java.len() + 8);
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(c) => out.push(c),
                None => return Err("a \\ at the end has nothing to escape".to_owned()),
            },
            '$' if chars.next_if_eq(&'{').is_some() => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(format!("${{{name} lacks its closing }}")),
                    }
                }
                if !regex.capture_names().flatten().any(|n| n == name) {
                    return Err(format!("there is no group named {name}"));
                }
                out.push_str(&format!("${{{name}}}"));
            }
            '$' => {
                let Some(mut number) = chars.next_if(char::is_ascii_digit).map(digit) else {
                    return Err("a $ must be followed by a group number or {name}".to_owned());
                };
                while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    let longer = number * 10 + digit(d);
                    if longer > groups {
                        break;
                    }
                    number = longer;
                    chars.next();
                }
                if number > groups {
                    return Err(format!(
                        "there is no group {number} ({groups} in the regex)"
                    ));
                }
                out.push_str(&format!("${{{number}}}"));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn digit(c: char) -> usize {
    c.to_digit(10).unwrap_or(0) as usize
}

impl TopicRoute {
    /// The topic for `value`, or `None` when the regex does not match it.
    pub(crate) fn topic(&self, value: &str) -> Option<String> {
        let captures = self.regex.captures(value)?;
        let mut out = String::new();
        captures.expand(&self.replacement, &mut out);
        Some(out)
    }

    pub(crate) fn regex(&self) -> &str {
        self.regex.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_debeziums_placement_syntax() {
        let p = parse_placements(&strings(&[
            "type:header:eventType",
            "tenant:header",
            "version:envelope:v",
            "shard:partition",
        ]))
        .unwrap();
        assert_eq!(
            p,
            vec![
                Placement::Header {
                    column: "type".into(),
                    name: "eventType".into()
                },
                Placement::Header {
                    column: "tenant".into(),
                    name: "tenant".into()
                },
                Placement::Envelope {
                    column: "version".into(),
                    name: "v".into()
                },
                Placement::Partition {
                    column: "shard".into()
                },
            ]
        );
        for bad in ["x", "x:body", "x::y", "a:partition,b", "x:envelope:payload"] {
            let entries: Vec<String> = bad.split(',').map(str::to_owned).collect();
            let entries = if bad == "a:partition,b" {
                strings(&["a:partition", "b:partition"])
            } else {
                entries
            };
            let e = parse_placements(&entries).unwrap_err();
            assert!(
                e.to_string().contains("outbox.additional_placement"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn values_as_stored_as_json_string_and_in_an_envelope() {
        let payload = Bytes::from_static(br#"{"id": 1, "note": "a \"b\""}"#);
        assert_eq!(
            shape_value(PayloadFormat::AsStored, &payload, true, &[]).unwrap(),
            payload
        );
        let s = shape_value(PayloadFormat::JsonString, &payload, true, &[]).unwrap();
        assert_eq!(&s[..], br#""{\"id\": 1, \"note\": \"a \\\"b\\\"\"}""#);
        let parsed: String = serde_json::from_slice(&s).unwrap();
        assert_eq!(parsed.as_bytes(), &payload[..]);

        let env = shape_value(
            PayloadFormat::AsStored,
            &payload,
            true,
            &[("v", Some(b"2")), ("tenant", None)],
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&env).unwrap();
        assert_eq!(v["payload"]["id"], 1);
        assert_eq!(v["v"], "2");
        assert!(v["tenant"].is_null());
        // A text payload is a string inside the envelope.
        let env = shape_value(
            PayloadFormat::AsStored,
            &Bytes::from_static(b"plain"),
            false,
            &[("v", Some(b"2"))],
        )
        .unwrap();
        assert_eq!(&env[..], br#"{"payload":"plain","v":"2"}"#);
    }

    #[test]
    fn routes_like_debeziums_regex_router() {
        let route = RouteSettings {
            regex: "(?<routedByValue>.*)".into(),
            replacement: "outbox.event.${routedByValue}".into(),
        }
        .compile()
        .unwrap()
        .unwrap();
        assert_eq!(route.topic("Order").as_deref(), Some("outbox.event.Order"));
        let route = RouteSettings {
            regex: r"(?<kind>[a-z]+)-(\d+)".into(),
            replacement: "${kind}.v$2".into(),
        }
        .compile()
        .unwrap()
        .unwrap();
        assert_eq!(route.topic("order-2").as_deref(), Some("order.v2"));
        assert_eq!(route.topic("Order-2"), None, "the whole value must match");
        assert!(RouteSettings::default().compile().unwrap().is_none());
        let e = RouteSettings {
            regex: "(".into(),
            ..RouteSettings::default()
        }
        .compile()
        .unwrap_err();
        assert!(e.to_string().contains("outbox.route.regex"), "{e}");
    }

    /// D1: the replacement is Java's (Debezium's RegexRouter): `$` takes
    /// only digits (as many as still name a group), `${name}` a named group,
    /// `\` escapes the next character.
    #[test]
    fn the_replacement_is_read_as_java_reads_it() {
        let topic = |regex: &str, replacement: &str, value: &str| {
            RouteSettings {
                regex: regex.into(),
                replacement: replacement.into(),
            }
            .compile()
            .unwrap()
            .unwrap()
            .topic(value)
        };
        let all = "(?<routedByValue>.*)";
        assert_eq!(
            topic(all, "$1_events", "order").as_deref(),
            Some("order_events")
        );
        assert_eq!(
            topic(all, "outbox.$1_v2", "order").as_deref(),
            Some("outbox.order_v2")
        );
        // One group: `$12` is group 1 then "2".
        assert_eq!(topic(all, "t$12", "order").as_deref(), Some("torder2"));
        assert_eq!(topic(all, r"a\$b.$1", "x").as_deref(), Some("a$b.x"));
        assert_eq!(topic(all, r"a\\b", "x").as_deref(), Some(r"a\b"));
        assert_eq!(
            topic(all, "${routedByValue}.x", "o").as_deref(),
            Some("o.x")
        );
        let two = "(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)";
        assert_eq!(topic(two, "$10-$1", "abcdefghij").as_deref(), Some("j-a"));
        for (bad, why) in [
            ("$2", "no group 2"),
            ("${nope}", "no group named nope"),
            ("$x", "a $ must be followed"),
            ("$", "a $ must be followed"),
            (r"a\", "nothing to escape"),
        ] {
            let e = RouteSettings {
                regex: all.into(),
                replacement: bad.into(),
            }
            .compile()
            .unwrap_err();
            assert!(
                e.to_string().contains("outbox.route.replacement") && e.to_string().contains(why),
                "{bad}: {e}"
            );
        }
    }
}
