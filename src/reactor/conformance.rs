//! Backend conformance tests (to be written).
