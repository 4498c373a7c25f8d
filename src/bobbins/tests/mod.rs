//! Unit tests of the manifest rules and the expansion rules, each named after its rule.

mod catalog;
mod expand;
mod manifest;
mod poll;
