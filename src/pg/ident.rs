//! Quoting of SQL identifiers and literals, so that names from configuration
//! can never change the meaning of a statement.

use std::fmt;

use super::error::PgError;

/// `name` as a double-quoted SQL identifier; embedded double quotes are doubled.
/// A quoted identifier is taken verbatim (no case folding).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string literal for the replication command grammar, which knows only
/// `'...'` with doubled quotes (no E'' strings, backslash is not special).
pub(crate) fn quote_replication_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A table name with its schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QualifiedTable {
    pub schema: String,
    pub name: String,
}

impl QualifiedTable {
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> QualifiedTable {
        QualifiedTable {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// Parses `table` or `schema.table` as SQL would: unquoted parts are
    /// folded to lower case, `"Quoted"` parts are kept verbatim (with `""`
    /// for a quote). The schema defaults to `public`.
    pub fn parse(s: &str) -> Result<QualifiedTable, PgError> {
        let bad = |message: String| PgError::Config {
            key: "table".into(),
            message: format!("{s:?}: {message}"),
        };
        let mut parts = Vec::new();
        let mut chars = s.chars().peekable();
        loop {
            let mut part = String::new();
            if chars.next_if_eq(&'"').is_some() {
                loop {
                    match chars.next() {
                        None => return Err(bad("unterminated quoted identifier".into())),
                        Some('"') if chars.next_if_eq(&'"').is_some() => part.push('"'),
                        Some('"') => break,
                        Some(c) => part.push(c),
                    }
                }
            } else {
                while let Some(c) = chars.next_if(|c| *c != '.') {
                    if c == '"' || c.is_whitespace() {
                        return Err(bad(format!(
                            "unexpected {c:?} in an unquoted name; quote it"
                        )));
                    }
                    part.extend(c.to_lowercase());
                }
            }
            if part.is_empty() {
                return Err(bad("empty name".into()));
            }
            parts.push(part);
            match chars.next() {
                None => break,
                Some('.') => {}
                Some(c) => return Err(bad(format!("unexpected {c:?} after a quoted name"))),
            }
        }
        match <[String; 2]>::try_from(parts) {
            Ok([schema, name]) => Ok(QualifiedTable { schema, name }),
            Err(parts) if parts.len() == 1 => Ok(QualifiedTable::new("public", parts[0].clone())),
            Err(_) => Err(bad("expected table or schema.table".into())),
        }
    }
}

/// Quoted for SQL: `"schema"."name"`.
impl fmt::Display for QualifiedTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}",
            quote_ident(&self.schema),
            quote_ident(&self.name)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("My Table"), "\"My Table\"");
        assert_eq!(quote_ident(""), "\"\"");
        // A name trying to close the identifier and append a statement stays one identifier.
        let evil = "x\" FOR ALL TABLES; DROP TABLE users; --";
        assert_eq!(
            quote_ident(evil),
            "\"x\"\" FOR ALL TABLES; DROP TABLE users; --\""
        );
    }

    #[test]
    fn quotes_replication_literals() {
        assert_eq!(quote_replication_literal("a'b\\c"), "'a''b\\c'");
    }

    #[test]
    fn parses_table_names() {
        for (text, schema, name) in [
            ("public.outbox_events", "public", "outbox_events"),
            ("Outbox", "public", "outbox"),
            ("\"My Schema\".\"Evil\"\"Name\"", "My Schema", "Evil\"Name"),
            ("s.\"a.b\"", "s", "a.b"),
        ] {
            assert_eq!(
                QualifiedTable::parse(text).unwrap(),
                QualifiedTable::new(schema, name),
                "{text}"
            );
        }
        for bad in ["", ".", "a.", ".a", "a.b.c", "\"a", "a b", "\"a\"x", "a\"b"] {
            assert!(
                matches!(QualifiedTable::parse(bad), Err(PgError::Config { ref key, .. }) if key == "table"),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn displays_quoted() {
        assert_eq!(
            QualifiedTable::new("public", "we\"ird").to_string(),
            "\"public\".\"we\"\"ird\""
        );
    }
}
