//! R2: the enums of the model — mail state and kind, alert kind and state, job and row state —
//! each declared once with [`wire_enum!`], which derives its list, wire names, `Display`,
//! `FromStr` and serde form from the one declaration; and R4's [`UnknownName`], the error of
//! reading a name that is none of an enum's.

/// `given` is not a name of `what`; `known` says which are (`; one of new, delivered, …`, or empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}{known}")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    known: String,
}

impl UnknownName {
    /// `known` is printed after the name as it is: `"; one of a, b"`, or `""` for none.
    pub fn new(what: &'static str, given: &str, known: impl Into<String>) -> Self {
        UnknownName { what, given: given.to_string(), known: known.into() }
    }

    /// `given` is none of `names`, which the message lists.
    pub fn one_of(what: &'static str, given: &str, names: &[&str]) -> Self {
        UnknownName::new(what, given, format!("; one of {}", names.join(", ")))
    }
}

/// `'a', 'b'` — a SQL list of wire names for `IN (…)`, so a query's set of states is derived from
/// the core's predicate rather than written out beside it (R3). The names are the enum's own
/// literals, never input, so quoting them is safe.
pub fn sql_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

/// `column = 'a'` for one name, `column IN ('a', 'b')` for several, `FALSE` for none: the form a
/// partial index written for one name was built with, so a derived filter still matches it.
pub fn sql_is(column: &str, names: &[&str]) -> String {
    match names {
        [] => "FALSE".to_string(),
        [one] => format!("{column} = '{one}'"),
        many => format!("{column} IN ({})", sql_list(many.iter().copied())),
    }
}

/// `column = 'a'` for one name, `(column = 'a' OR column = 'b' OR …)` for several, `FALSE` for
/// none: [`sql_is`] for a set a partial index is written over. SQLite evaluates an index's
/// predicate on every row a statement writes, and a constant `IN` list of three or more builds
/// a temporary b-tree each time the statement runs (P2: a third of an expiry's cost); an `OR`
/// chain compares in place. PostgreSQL proves either form from the other.
pub fn sql_any(column: &str, names: &[&str]) -> String {
    match names {
        [] => "FALSE".to_string(),
        [one] => format!("{column} = '{one}'"),
        many => format!("({})", many.iter().map(|n| format!("{column} = '{n}'")).collect::<Vec<_>>().join(" OR ")),
    }
}

/// The negation of [`sql_is`]: `column != 'a'`, `column NOT IN ('a', 'b')`, `TRUE` for none.
pub fn sql_is_not(column: &str, names: &[&str]) -> String {
    match names {
        [] => "TRUE".to_string(),
        [one] => format!("{column} != '{one}'"),
        many => format!("{column} NOT IN ({})", sql_list(many.iter().copied())),
    }
}

/// Declares a model enum once: each variant with its wire name. Derives `ALL` (every variant, in
/// declaration order — the order lists and presentation use), `NAMES`, `as_str`, `Display`,
/// `FromStr` (an [`UnknownName`] listing every name), `Serialize` and `Deserialize` by wire name.
/// With `parse = path` the enum's own parser (accepting aliases) is used for `FromStr` and serde.
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident as $what:literal $(, parse = $parse:path)? {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($wire),+].len()] = [$($name::$variant),+];
            /// Every wire name, in declaration order.
            pub const NAMES: [&'static str; [$($wire),+].len()] = [$($wire),+];
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $wire ),+
                }
            }

            /// The variant whose wire name is exactly `name`.
            pub fn from_name(name: &str) -> Option<$name> {
                match name {
                    $( $wire => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The wire names of the variants `keep` holds, as a SQL `IN` list (R3: a query's set
            /// of states derived from the core's predicate, never written out beside it).
            pub fn sql_in(keep: impl Fn($name) -> bool) -> String {
                $crate::names::sql_list($name::ALL.into_iter().filter(|v| keep(*v)).map($name::as_str))
            }

            /// `column` holds one of the variants `keep` holds (`names::sql_is`).
            pub fn sql_is(column: &str, keep: impl Fn($name) -> bool) -> String {
                $crate::names::sql_is(column, &$name::names_of(keep))
            }

            /// `column` holds one of the variants `keep` holds, as a partial index's predicate
            /// is written (`names::sql_any`).
            pub fn sql_any(column: &str, keep: impl Fn($name) -> bool) -> String {
                $crate::names::sql_any(column, &$name::names_of(keep))
            }

            /// `column` holds none of the variants `keep` holds.
            pub fn sql_is_not(column: &str, keep: impl Fn($name) -> bool) -> String {
                $crate::names::sql_is_not(column, &$name::names_of(keep))
            }

            fn names_of(keep: impl Fn($name) -> bool) -> Vec<&'static str> {
                $name::ALL.into_iter().filter(|v| keep(*v)).map($name::as_str).collect()
            }

            #[allow(dead_code)]
            fn parse_name(name: &str) -> Result<$name, $crate::names::UnknownName> {
                $name::from_name(name)
                    .ok_or_else(|| $crate::names::UnknownName::one_of($what, name, &$name::NAMES))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $crate::wire_enum!(@parse $name, s $(, $parse)?)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Names;
                impl ::serde::de::Visitor<'_> for Names {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        write!(f, "a {}: one of {}", $what, $name::NAMES.join(", "))
                    }
                    fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        v.parse::<$name>().map_err(E::custom)
                    }
                }
                d.deserialize_str(Names)
            }
        }
    };
    (@parse $name:ident, $s:ident) => { $name::parse_name($s) };
    (@parse $name:ident, $s:ident, $parse:path) => { $parse($s) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r4_an_unknown_name_says_what_it_is_not_and_what_is() {
        let e = UnknownName::new("mail state", "sent", "; one of new, delivered");
        assert_eq!(e.to_string(), "unknown mail state \"sent\"; one of new, delivered");
        assert_eq!(UnknownName::new("alert kind", "x", "").to_string(), "unknown alert kind \"x\"");
    }

    crate::wire_enum! {
        enum Tint as "tint" {
            Red = "red",
            /// Two words on the wire.
            DeepBlue = "deep-blue",
        }
    }

    #[test]
    fn r2_one_declaration_gives_the_list_the_names_and_both_directions() {
        assert_eq!(Tint::ALL, [Tint::Red, Tint::DeepBlue]);
        assert_eq!(Tint::NAMES, ["red", "deep-blue"]);
        for t in Tint::ALL {
            assert_eq!(t.as_str().parse::<Tint>(), Ok(t));
            assert_eq!(serde_json::to_string(&t).ok(), Some(format!("\"{t}\"")));
            assert_eq!(serde_json::from_str::<Tint>(&format!("\"{t}\"")).ok(), Some(t));
        }
        let e = "green".parse::<Tint>().err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("unknown tint \"green\"; one of red, deep-blue"));
        let e = serde_json::from_str::<Tint>("\"green\"").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("unknown tint \"green\"; one of red, deep-blue"), "{e}");
        assert!(serde_json::from_str::<Tint>("3").is_err());
    }

    #[test]
    fn r3_a_sql_list_quotes_each_name() {
        assert_eq!(sql_list(["new", "seen"]), "'new', 'seen'");
        assert_eq!(sql_list(Tint::ALL.iter().map(|t| t.as_str())), "'red', 'deep-blue'");
        assert_eq!(Tint::sql_in(|t| t != Tint::Red), "'deep-blue'");
        assert_eq!(Tint::sql_is("tint", |t| t == Tint::Red), "tint = 'red'");
        assert_eq!(Tint::sql_is("tint", |_| true), "tint IN ('red', 'deep-blue')");
        assert_eq!(Tint::sql_is("tint", |_| false), "FALSE");
        assert_eq!(Tint::sql_is_not("tint", |t| t == Tint::Red), "tint != 'red'");
        assert_eq!(Tint::sql_is_not("tint", |_| true), "tint NOT IN ('red', 'deep-blue')");
        assert_eq!(Tint::sql_is_not("tint", |_| false), "TRUE");
        assert_eq!(Tint::sql_any("tint", |t| t == Tint::Red), "tint = 'red'");
        assert_eq!(Tint::sql_any("tint", |_| true), "(tint = 'red' OR tint = 'deep-blue')");
        assert_eq!(Tint::sql_any("tint", |_| false), "FALSE");
        assert_eq!(sql_any("s", &["a", "b", "c"]), "(s = 'a' OR s = 'b' OR s = 'c')");
    }
}
