//! The gRPC codec of every Weir service: prost's, except that a message's buffer is
//! sized to the message before it is encoded (issue 17). Prost's codec lets the buffer
//! grow as it writes, from 8 KiB by doubling, so a 1 MiB read reply was copied about
//! once more by the reallocations than by its encoding (a profile of a TLS consume had
//! them at 5 % of the process's CPU).

use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// prost's codec, with messages encoded into a buffer reserved to their size.
#[derive(Debug, Clone, Copy)]
pub struct SizedProstCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SizedProstCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SizedProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Encodes `T` into a buffer first reserved to `T`'s encoded length.
#[derive(Debug, Clone, Copy)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
