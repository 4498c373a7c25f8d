//! The delivery vocabulary (spec 3, 4, 6.5): batch states, destination (breaker) states,
//! outcome classes and attempt outcomes, as enums that `store`, `dispatch`,
//! `destinations` and `observe` share, so every match over them is exhaustive and a
//! misspelt state does not compile.
//!
//! Each word is spelt once, here: `as_str` is what the database and the `--json` output
//! hold, `parse` reads it back at that edge (the store's column conversions call it). Every
//! other module speaks the enums.
//!
//! Must not: depend on any other module of the crate (it sits below `store`), or hold any
//! rule beyond what a word means (the transitions live in `store` and `dispatch`).

/// Defines a vocabulary enum: its variants with their one spelling, `ALL`, `as_str`,
/// `parse`, `Display` and serde as that same string.
macro_rules! vocabulary {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every word, in the spec's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The word as stored and printed.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The word read back; `None` for anything this build does not know.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "unknown {} {text:?}",
                        stringify!($name)
                    ))
                })
            }
        }
    };
}

vocabulary! {
    /// A batch's place in its life (spec 4.1; the `batches.state` CHECK constraint).
    BatchState {
        /// Events join it.
        Open => "open",
        /// Content frozen, waiting for its gate.
        Sealed => "sealed",
        /// Claimed by a worker (lease_until, lease_owner).
        Leased => "leased",
        /// Waiting for next_attempt_at.
        Retry => "retry",
        Delivered => "delivered",
        /// Waiting for an operator (replay or drop); never pruned.
        Dead => "dead",
        /// Discarded by an operator; automatic code never writes it.
        Dropped => "dropped",
    }
}

vocabulary! {
    /// A destination's gate (spec 4.2; the `destinations.state` CHECK constraint).
    BreakerState {
        /// Delivering normally.
        Closed => "closed",
        /// Tripped: nothing is claimed until the cooldown passes.
        Open => "open",
        /// One rotating probe at a time.
        HalfOpen => "half_open",
        /// An operator's pause: only `hookspool resume` leaves it.
        Paused => "paused",
    }
}

vocabulary! {
    /// Why an attempt did not succeed (spec 6.5), stored in `attempts.klass` and
    /// `batches.last_class`. `Poison` is decided by the dispatcher, never by a destination;
    /// `Quarantine` only ever labels intake quarantine batches.
    Klass {
        Transport => "transport",
        Throttle => "throttle",
        Batch => "batch",
        Config => "config",
        Permanent => "permanent",
        Poison => "poison",
        Quarantine => "quarantine",
    }
}

vocabulary! {
    /// How an attempt row ended (spec 3 `attempts.outcome`).
    AttemptOutcome {
        /// The batch was delivered.
        Ok => "ok",
        /// The batch went back to retry (a failure, or a recovered lease).
        Retry => "retry",
        Dead => "dead",
        /// The worker reported after losing its lease; its result was not applied.
        Discarded => "discarded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_reads_back_as_itself_and_nothing_else_parses() {
        for s in BatchState::ALL {
            assert_eq!(BatchState::parse(s.as_str()), Some(*s));
        }
        for s in BreakerState::ALL {
            assert_eq!(BreakerState::parse(s.as_str()), Some(*s));
        }
        for k in Klass::ALL {
            assert_eq!(Klass::parse(k.as_str()), Some(*k));
        }
        for o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(*o));
        }
        assert_eq!(BatchState::parse("Delivered"), None);
        assert_eq!(BreakerState::parse("half-open"), None);
        assert_eq!(Klass::parse(""), None);
    }

    #[test]
    fn serde_speaks_the_stored_word() {
        assert_eq!(
            serde_json::to_string(&BreakerState::HalfOpen).unwrap(),
            "\"half_open\""
        );
        let k: Klass = serde_json::from_str("\"throttle\"").unwrap();
        assert_eq!(k, Klass::Throttle);
        assert!(serde_json::from_str::<BatchState>("\"gone\"").is_err());
    }
}
