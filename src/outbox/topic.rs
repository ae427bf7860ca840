//! Kafka topic names: the legal-name rules and the routing template.
//!
//! Kafka accepts a topic name of 1 to 249 characters drawn from `[a-zA-Z0-9._-]`,
//! except `.` and `..` (they would collide with directory names on the broker).
//! A template is parsed once, when the configuration is loaded, into literal
//! parts and placeholders; rendering an event only concatenates and then checks
//! the one thing that depends on the row: the characters and length that the
//! placeholder values contributed.

use std::fmt;

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// Why a topic name is not a legal Kafka topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicNameError {
    Empty,
    DotOrDotDot,
    TooLong { len: usize },
    IllegalChar { ch: char, at: usize },
}

impl fmt::Display for TopicNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicNameError::Empty => f.write_str("a topic name cannot be empty"),
            TopicNameError::DotOrDotDot => f.write_str("a topic name cannot be \".\" or \"..\""),
            TopicNameError::TooLong { len } => {
                write!(
                    f,
                    "a topic name has at most {MAX_TOPIC_LEN} characters, this one has {len}"
                )
            }
            TopicNameError::IllegalChar { ch, at } => write!(
                f,
                "character {ch:?} at byte {at} is not allowed (only ASCII letters, digits, '.', '_' and '-')"
            ),
        }
    }
}

fn is_topic_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// First character of `s` outside Kafka's topic alphabet, with its byte offset.
fn first_illegal(s: &str) -> Option<(char, usize)> {
    s.char_indices()
        .find(|&(_, c)| !(c.is_ascii() && is_topic_byte(c as u8)))
        .map(|(i, c)| (c, i))
}

/// Checks a complete topic name against Kafka's rules.
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() {
        return Err(TopicNameError::Empty);
    }
    if name == "." || name == ".." {
        return Err(TopicNameError::DotOrDotDot);
    }
    if let Some((ch, at)) = first_illegal(name) {
        return Err(TopicNameError::IllegalChar { ch, at });
    }
    // All characters are ASCII here, so bytes == characters.
    if name.len() > MAX_TOPIC_LEN {
        return Err(TopicNameError::TooLong { len: name.len() });
    }
    Ok(())
}

/// The values a template placeholder can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// `{aggregate_type}`: the row's aggregate type.
    AggregateType,
    /// `{event_type}`: the row's event type.
    EventType,
    /// `{table}`: the outbox table's name without its schema; fixed per
    /// configuration, so it is resolved into a literal before any event.
    Table,
}

impl Placeholder {
    const ALL: [(&'static str, Placeholder); 3] = [
        ("aggregate_type", Placeholder::AggregateType),
        ("event_type", Placeholder::EventType),
        ("table", Placeholder::Table),
    ];
}

/// Placeholders a template may use, for error messages.
pub const ALLOWED_PLACEHOLDERS: &str = "{aggregate_type}, {event_type}, {table}";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Var(Placeholder),
}

/// Checks the characters of a literal template segment that starts at byte `base`.
fn check_literal(segment: &str, base: usize) -> Result<(), TemplateError> {
    match first_illegal(segment) {
        Some((ch, at)) => Err(TemplateError::Name(TopicNameError::IllegalChar {
            ch,
            at: base + at,
        })),
        None => Ok(()),
    }
}

/// Why a topic template was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    UnknownPlaceholder(String),
    Unclosed {
        at: usize,
    },
    StrayClose {
        at: usize,
    },
    /// A literal part (or the whole placeholder-free template) breaks the name rules.
    Name(TopicNameError),
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::UnknownPlaceholder(p) => {
                write!(
                    f,
                    "unknown placeholder {{{p}}}; allowed: {ALLOWED_PLACEHOLDERS}"
                )
            }
            TemplateError::Unclosed { at } => {
                write!(
                    f,
                    "'{{' at byte {at} is not closed; allowed placeholders: {ALLOWED_PLACEHOLDERS}"
                )
            }
            TemplateError::StrayClose { at } => {
                write!(
                    f,
                    "'}}' at byte {at} closes nothing; allowed placeholders: {ALLOWED_PLACEHOLDERS}"
                )
            }
            TemplateError::Name(e) => write!(
                f,
                "{e}; a template is a Kafka topic name with placeholders {ALLOWED_PLACEHOLDERS}"
            ),
        }
    }
}

/// A parsed topic template such as `outbox.event.{aggregate_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
    /// Sum of the literal parts' lengths (the rendered name is at least this long).
    literal_len: usize,
}

impl TopicTemplate {
    /// Parses `template`, checking that every literal character is legal in a
    /// topic name and that a placeholder-free template is a complete legal name.
    /// `{table}` is replaced by `table_name` right away.
    pub fn parse(template: &str, table_name: &str) -> Result<TopicTemplate, TemplateError> {
        let mut parts: Vec<Part> = Vec::new();
        let mut literal = String::new();
        let mut rest = template;
        let mut offset = 0;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(TemplateError::StrayClose { at: offset + open });
            }
            check_literal(&rest[..open], offset)?;
            literal.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or(TemplateError::Unclosed { at: offset + open })?;
            let name = &after[..close];
            let var = Placeholder::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, p)| p)
                .ok_or_else(|| TemplateError::UnknownPlaceholder(name.to_owned()))?;
            match var {
                Placeholder::Table => {
                    if let Some((ch, _)) = first_illegal(table_name) {
                        let at = offset + open;
                        return Err(TemplateError::Name(TopicNameError::IllegalChar { ch, at }));
                    }
                    literal.push_str(table_name);
                }
                v => {
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Var(v));
                }
            }
            let consumed = open + 1 + close + 1;
            offset += consumed;
            rest = &rest[consumed..];
        }
        check_literal(rest, offset)?;
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }

        let literal_len = parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.len(),
                Part::Var(_) => 0,
            })
            .sum();
        if literal_len > MAX_TOPIC_LEN {
            return Err(TemplateError::Name(TopicNameError::TooLong {
                len: literal_len,
            }));
        }
        let template = TopicTemplate { parts, literal_len };
        if let Some(fixed) = template.fixed() {
            validate_topic_name(fixed).map_err(TemplateError::Name)?;
        }
        Ok(template)
    }

    /// Whether the template contains `{event_type}`.
    pub fn uses_event_type(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Var(Placeholder::EventType)))
    }

    /// The topic when the template has no per-event placeholder.
    pub fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Literal(s)] => Some(s),
            _ => None,
        }
    }

    /// Renders the topic of one event. Literal parts were checked at parse
    /// time; the values are checked here, so `order/x` as an aggregate type
    /// yields an error rather than an illegal topic.
    pub fn render(
        &self,
        aggregate_type: &str,
        event_type: &str,
    ) -> Result<String, (String, TopicNameError)> {
        let mut out =
            String::with_capacity(self.literal_len + aggregate_type.len() + event_type.len());
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Var(Placeholder::AggregateType) => out.push_str(aggregate_type),
                Part::Var(Placeholder::EventType) => out.push_str(event_type),
                // Resolved into a literal by `parse`.
                Part::Var(Placeholder::Table) => {}
            }
        }
        match validate_topic_name(&out) {
            Ok(()) => Ok(out),
            Err(e) => Err((out, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_legal_names_at_the_edges() {
        for ok in [
            "a",
            "A-Z_0.9",
            "...",
            ".a",
            "a..",
            "-",
            "_",
            &"x".repeat(249),
        ] {
            assert_eq!(validate_topic_name(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn rejects_illegal_names() {
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert_eq!(validate_topic_name("."), Err(TopicNameError::DotOrDotDot));
        assert_eq!(validate_topic_name(".."), Err(TopicNameError::DotOrDotDot));
        assert_eq!(
            validate_topic_name(&"x".repeat(250)),
            Err(TopicNameError::TooLong { len: 250 })
        );
        assert_eq!(
            validate_topic_name("order/x"),
            Err(TopicNameError::IllegalChar { ch: '/', at: 5 })
        );
        for bad in ["a b", "a:b", "ä", "a\0", "a+b", "a{b"] {
            assert!(
                matches!(
                    validate_topic_name(bad),
                    Err(TopicNameError::IllegalChar { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn renders_the_default_template() {
        let t = TopicTemplate::parse("outbox.event.{aggregate_type}", "outbox_events").unwrap();
        assert_eq!(t.fixed(), None);
        assert_eq!(t.render("Order", "Created").unwrap(), "outbox.event.Order");
    }

    #[test]
    fn renders_every_placeholder_and_resolves_table_once() {
        let t =
            TopicTemplate::parse("{table}.{aggregate_type}-{event_type}", "outbox_events").unwrap();
        assert_eq!(
            t.render("order", "created").unwrap(),
            "outbox_events.order-created"
        );
        let fixed = TopicTemplate::parse("cdc.{table}", "outbox_events").unwrap();
        assert_eq!(fixed.fixed(), Some("cdc.outbox_events"));
    }

    #[test]
    fn rendered_names_are_validated() {
        let t = TopicTemplate::parse("{aggregate_type}", "t").unwrap();
        let (topic, err) = t.render("order/x", "e").unwrap_err();
        assert_eq!(topic, "order/x");
        assert_eq!(err, TopicNameError::IllegalChar { ch: '/', at: 5 });
        assert_eq!(t.render("", "e").unwrap_err().1, TopicNameError::Empty);
        assert_eq!(
            t.render("..", "e").unwrap_err().1,
            TopicNameError::DotOrDotDot
        );
        assert_eq!(t.render(&"a".repeat(249), "e").unwrap(), "a".repeat(249));
        let long = TopicTemplate::parse("p.{aggregate_type}", "t").unwrap();
        assert_eq!(
            long.render(&"a".repeat(248), "e").unwrap_err().1,
            TopicNameError::TooLong { len: 250 }
        );
    }

    #[test]
    fn rejects_bad_templates() {
        assert_eq!(
            TopicTemplate::parse("outbox.{aggregate}", "t"),
            Err(TemplateError::UnknownPlaceholder("aggregate".into()))
        );
        assert_eq!(
            TopicTemplate::parse("a.{event_type", "t"),
            Err(TemplateError::Unclosed { at: 2 })
        );
        assert_eq!(
            TopicTemplate::parse("a}b", "t"),
            Err(TemplateError::StrayClose { at: 1 })
        );
        assert_eq!(
            TopicTemplate::parse("a/{event_type}", "t"),
            Err(TemplateError::Name(TopicNameError::IllegalChar {
                ch: '/',
                at: 1
            }))
        );
        assert_eq!(
            TopicTemplate::parse("", "t"),
            Err(TemplateError::Name(TopicNameError::Empty))
        );
        assert_eq!(
            TopicTemplate::parse("..", "t"),
            Err(TemplateError::Name(TopicNameError::DotOrDotDot))
        );
        assert!(matches!(
            TopicTemplate::parse(&format!("{}{{aggregate_type}}", "x".repeat(250)), "t"),
            Err(TemplateError::Name(TopicNameError::TooLong { len: 250 }))
        ));
        // A table name that is not a legal topic fragment makes `{table}` unusable.
        assert!(matches!(
            TopicTemplate::parse("{table}", "Order Events"),
            Err(TemplateError::Name(TopicNameError::IllegalChar {
                ch: ' ',
                ..
            }))
        ));
    }
}
