//! Durable state on redb (being built).
