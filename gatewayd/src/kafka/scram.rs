//! The server side of SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) over
//! Kafka's SaslAuthenticate: the username is a token's name and the password its
//! secret, checked against the salted keys stored when the token was issued
//! (`weir_meta::scram`). Two round trips: client-first → server-first, client-final →
//! server-final. Channel binding is not offered (gs2 `n` or `y`).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use weir_meta::model::TokenRow;
use weir_meta::scram::{Mechanism, ScramCredential};

/// An exchange after the server-first message: what the client-final must prove.
pub struct Started {
    mechanism: Mechanism,
    /// `None` for a name with no usable token: the exchange goes on with made-up keys
    /// and fails at its end, so the answers do not tell which names exist.
    token: Option<TokenRow>,
    credential: ScramCredential,
    /// `client-first-message-bare`, `server-first-message` and the combined nonce.
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// Answers a client-first message: the exchange so far and the server-first message.
/// `token` finds a live token by name.
pub fn start(
    mechanism: Mechanism,
    client_first: &[u8],
    token: impl FnOnce(&str) -> Option<TokenRow>,
) -> Result<(Started, Vec<u8>), String> {
    let msg = std::str::from_utf8(client_first).map_err(|_| "client-first message is not UTF-8")?;
    // gs2-header: "n,," or "y,," (no channel binding), optionally with "a=authzid".
    let mut parts = msg.splitn(3, ',');
    let (cb, _authzid, bare) = match (parts.next(), parts.next(), parts.next()) {
        (Some(cb), Some(a), Some(bare)) => (cb, a, bare),
        _ => return Err("malformed client-first message".into()),
    };
    if cb != "n" && cb != "y" {
        return Err("channel binding is not supported".into());
    }
    let mut user = None;
    let mut client_nonce = None;
    for attr in bare.split(',') {
        match attr.split_once('=') {
            Some(("n", v)) => user = Some(unescape(v)?),
            Some(("r", v)) => client_nonce = Some(v.to_string()),
            // Extensions (Kafka's `tokenauth`) are ignored.
            _ => {}
        }
    }
    let user = user.ok_or("client-first message has no username")?;
    let client_nonce = client_nonce
        .filter(|n| !n.is_empty())
        .ok_or("client-first message has no nonce")?;
    let token = token(&user).filter(|t| {
        if t.scram.is_none() {
            tracing::info!(token = %t.name, "SCRAM refused: the token was issued without SCRAM credentials; issue it again");
        }
        t.scram.is_some()
    });
    // A mechanism whose credential was removed (AlterUserScramCredentials) fails as
    // an unknown user does, indistinguishably.
    let found = token
        .as_ref()
        .and_then(|t| t.scram.as_ref())
        .and_then(|c| c.get(mechanism))
        .cloned();
    let token = token.filter(|_| found.is_some());
    let credential = found.unwrap_or_else(|| decoy(mechanism, &user));
    let mut server_nonce = [0u8; 18];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut server_nonce);
    let nonce = format!("{client_nonce}{}", B64.encode(server_nonce));
    let server_first = format!("r={nonce},s={},i={}", credential.salt, credential.iterations);
    let out = server_first.clone().into_bytes();
    Ok((
        Started {
            mechanism,
            token,
            credential,
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
        },
        out,
    ))
}

impl Started {
    /// Checks a client-final message's proof: the token, and the server-final message.
    pub fn finish(self, client_final: &[u8]) -> Result<(TokenRow, Vec<u8>), String> {
        let Some(token) = self.token.clone() else {
            return Err("unknown token name or wrong secret".into());
        };
        let msg = std::str::from_utf8(client_final).map_err(|_| "client-final message is not UTF-8")?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or("client-final message has no proof")?;
        let nonce = without_proof
            .split(',')
            .find_map(|a| a.strip_prefix("r="))
            .ok_or("client-final message has no nonce")?;
        // Kafka's broker accepts a nonce that ends with the exchange's, as librdkafka
        // (2.0 at least) sends its own nonce again before the server's full nonce; the
        // server's random part is in it either way, and the proof covers what was sent.
        if !nonce.ends_with(&self.nonce) {
            return Err("the nonce does not match the exchange's".into());
        }
        let proof = B64.decode(proof).map_err(|_| "the proof is not base64")?;
        let stored_key = B64
            .decode(&self.credential.stored_key)
            .map_err(|_| "stored key is not base64")?;
        let server_key = B64
            .decode(&self.credential.server_key)
            .map_err(|_| "server key is not base64")?;
        let auth_message = format!("{},{},{without_proof}", self.client_first_bare, self.server_first);
        let m = self.mechanism;
        let client_signature = m.hmac(&stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err("unknown token name or wrong secret".into());
        }
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        if !constant_time_eq(&m.hash(&client_key), &stored_key) {
            return Err("unknown token name or wrong secret".into());
        }
        let server_signature = m.hmac(&server_key, auth_message.as_bytes());
        Ok((token, format!("v={}", B64.encode(server_signature)).into_bytes()))
    }
}

/// Made-up keys for a name without a usable token: the salt is the same for the same
/// name within a process (as a real token's would be), and nothing can prove them.
fn decoy(mechanism: Mechanism, name: &str) -> ScramCredential {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut k);
        k
    });
    let salt = &mechanism.hmac(key, name.as_bytes())[..16];
    let garbage = B64.encode(mechanism.hmac(key, b"no such token"));
    ScramCredential {
        salt: B64.encode(salt),
        iterations: weir_meta::scram::ITERATIONS,
        stored_key: garbage.clone(),
        server_key: garbage,
    }
}

/// `saslname` unescaping: `=2C` is `,` and `=3D` is `=`; any other `=` is malformed.
fn unescape(name: &str) -> Result<String, String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err("malformed username".into()),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(secret: &str) -> TokenRow {
        TokenRow {
            name: "user".into(),
            secret_sha256: String::new(),
            scopes: vec![],
            revoked: false,
            issued_index: 1,
            expires_at_ms: None,
            scram: Some(weir_meta::scram::credentials(secret)),
        }
    }

    /// The client side of RFC 5802, for the test.
    fn client_final(m: Mechanism, secret: &str, client_first_bare: &str, server_first: &str) -> String {
        client_final_with(m, secret, client_first_bare, server_first, "")
    }

    /// As [`client_final`], with `before` in front of the nonce (librdkafka sends its
    /// own nonce again there).
    fn client_final_with(
        m: Mechanism,
        secret: &str,
        client_first_bare: &str,
        server_first: &str,
        before: &str,
    ) -> String {
        let attrs: std::collections::HashMap<&str, &str> =
            server_first.split(',').filter_map(|a| a.split_once('=')).collect();
        let salt = B64.decode(attrs["s"]).unwrap();
        let i: u32 = attrs["i"].parse().unwrap();
        let salted = match m {
            Mechanism::Sha256 => pbkdf2::pbkdf2_hmac_array::<sha2::Sha256, 32>(secret.as_bytes(), &salt, i).to_vec(),
            Mechanism::Sha512 => pbkdf2::pbkdf2_hmac_array::<sha2::Sha512, 64>(secret.as_bytes(), &salt, i).to_vec(),
        };
        let client_key = m.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={before}{}", attrs["r"]);
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = m.hmac(&m.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(sig).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn a_client_with_the_secret_authenticates_and_one_without_does_not() {
        for m in [Mechanism::Sha256, Mechanism::Sha512] {
            let row = token("s3cret");
            let bare = "n=user,r=fyko+d2lbbFgONRv9qkxdawL";
            let (started, server_first) = start(m, format!("n,,{bare}").as_bytes(), |_| Some(row.clone())).unwrap();
            let server_first = String::from_utf8(server_first).unwrap();
            assert!(server_first.starts_with("r=fyko+d2lbbFgONRv9qkxdawL"), "{server_first}");
            let good = client_final(m, "s3cret", bare, &server_first);
            let (who, server_final) = started.finish(good.as_bytes()).unwrap();
            assert_eq!(who.name, "user");
            assert!(server_final.starts_with(b"v="));

            let (started, server_first) = start(m, format!("n,,{bare}").as_bytes(), |_| Some(row.clone())).unwrap();
            let bad = client_final(m, "wrong", bare, &String::from_utf8(server_first).unwrap());
            assert!(started.finish(bad.as_bytes()).is_err());

            // librdkafka's form: its nonce, then the server's whole nonce.
            let (started, server_first) = start(m, format!("n,,{bare}").as_bytes(), |_| Some(row.clone())).unwrap();
            let server_first = String::from_utf8(server_first).unwrap();
            let librdkafka = client_final_with(m, "s3cret", bare, &server_first, "fyko+d2lbbFgONRv9qkxdawL");
            assert!(started.finish(librdkafka.as_bytes()).is_ok());
            // A nonce without the server's part is refused, even with a valid proof.
            let (started, _) = start(m, format!("n,,{bare}").as_bytes(), |_| Some(row.clone())).unwrap();
            let other = client_final(m, "s3cret", bare, &server_first);
            assert!(started.finish(other.as_bytes()).is_err());
        }
        // An unknown name gets a server-first like a real one, and fails at the end.
        let (started, decoy_first) = start(Mechanism::Sha256, b"n,,n=nobody,r=abc", |_| None).unwrap();
        let decoy_first = String::from_utf8(decoy_first).unwrap();
        assert!(
            decoy_first.starts_with("r=abc") && decoy_first.ends_with(",i=4096"),
            "{decoy_first}"
        );
        let attempt = client_final(Mechanism::Sha256, "guess", "n=nobody,r=abc", &decoy_first);
        assert!(started.finish(attempt.as_bytes()).is_err());
        assert!(start(Mechanism::Sha256, b"p=tls-unique,,n=user,r=abc", |_| None).is_err());
        assert_eq!(unescape("a=2Cb=3Dc").unwrap(), "a,b=c");
        assert!(unescape("a=2").is_err());
    }
}
