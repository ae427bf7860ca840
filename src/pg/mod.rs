pub mod lsn;
pub use lsn::Lsn;
