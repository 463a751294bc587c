#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_tests::fuzz::wal_segment(data));
