//! What the layers that use SQLite share: telling its failures apart.

/// Whether `e`, or any cause of it, is a SQLite failure of one of `codes`.
pub fn failed_with(e: &anyhow::Error, codes: &[rusqlite::ErrorCode]) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<rusqlite::Error>()
            .and_then(rusqlite::Error::sqlite_error_code)
            .is_some_and(|code| codes.contains(&code))
    })
}
