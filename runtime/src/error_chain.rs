//! One line from an error and its causes, for messages that cross a process
//! boundary as text (a worker's verdict, a driver's failure list).
//!
//! Library errors describe only their own level and attach the cause as their
//! `source` (STYLE.md); where such an error must become a string, this keeps the
//! causes that `Display` alone would drop.

use std::error::Error;

/// `error` and each of its sources, joined by `": "` (as anyhow's `{:#}` prints).
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(source) = cause {
        text.push_str(": ");
        text.push_str(&source.to_string());
        cause = source.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to node-1")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_message() {
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        ));
        assert_eq!(error_chain(&error), "cannot connect to node-1: timed out");
        let plain = std::io::Error::other("alone");
        assert_eq!(error_chain(&plain), "alone");
    }
}
