//! What of the CLI other programs use: the control socket's protocol,
//! parsed without acting on it. The socket's server, `ferry ctl`'s tests
//! and the fuzzer share this one parser.

pub mod protocol;
