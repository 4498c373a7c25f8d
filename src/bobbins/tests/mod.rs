//! Unit tests of the manifest rules and the expansion rules, each named after its rule.

mod expand;
mod manifest;
