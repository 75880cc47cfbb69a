//! What a process of the session keeps for itself: its configuration ([`config`], from the
//! environment it started with, [`env`]), which process it is ([`identity`]), and its handle on
//! the session store ([`store`]). The session's shared counters are the recorder's
//! (`aether_journal_recorder::tables`), re-exported here.
//!
//! Everything here is built at most once per process image and never freed ([`crate::once`]).

mod config;
mod env;
mod identity;
mod store;

pub use aether_journal_recorder::tables::{SharedCounters, map_shared};
pub use config::{Config, config, configure_in_constructor, init_from_ctor};
pub use env::{adopt_mark, capture_early_env, env_value, has_prefix};
pub use identity::{adopt_store_after_fork, collect_argv, on_main_thread, owns_memory};
pub use store::{
    ExecStore, Store, cwd_changed, cwd_changing, exec_store, names_changed, note_unjournaled, open_store_before_fork,
    open_store_children_need, outside_a_hook, published_store, store,
};
