//! The client library's reading of a daemon's byte stream: any bytes, in any chunks, give replies
//! or a typed error, never a panic.
#![no_main]
use conclave_client::core::ReplyDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let mut d = ReplyDecoder::default();
    for c in stream.chunks(chunk.max(1) as usize) {
        d.buffer().extend_from_slice(c);
        loop {
            match d.next_reply() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
});
