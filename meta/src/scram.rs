//! SCRAM credentials of a token's secret (RFC 5802, RFC 7677), for Kafka's
//! SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (issue 18). Only the salted keys are stored in
//! the metadata log, computed where the secret is made; the secret never leaves there.
//! The server side of the exchange is `gatewayd/src/kafka/scram.rs`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

/// Iterations of PBKDF2 for new credentials (Kafka's minimum and the RFC's example).
pub const ITERATIONS: u32 = 4096;
/// The most iterations a credential may ask of each login (Kafka's maximum).
pub const MAX_ITERATIONS: u32 = 16384;

/// One hash's salted keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    /// Base64 salt.
    pub salt: String,
    pub iterations: u32,
    /// Base64 `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: String,
    /// Base64 `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: String,
}

/// A token's credentials, one per mechanism: both when issued with its secret; either
/// set or removed since by AlterUserScramCredentials (issue 59).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<ScramCredential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha512: Option<ScramCredential>,
}

/// The two SCRAM mechanisms Kafka clients offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub fn parse(name: &str) -> Option<Mechanism> {
        match name {
            "SCRAM-SHA-256" => Some(Mechanism::Sha256),
            "SCRAM-SHA-512" => Some(Mechanism::Sha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's number of the mechanism (`ScramMechanism`: 1 and 2).
    pub fn kafka_type(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<Mechanism> {
        match t {
            1 => Some(Mechanism::Sha256),
            2 => Some(Mechanism::Sha512),
            _ => None,
        }
    }

    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    /// `HMAC(key, data)` with this mechanism's hash.
    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut m = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    /// `H(data)`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, secret: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(secret.as_bytes(), salt, iterations).to_vec(),
            Mechanism::Sha512 => pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(secret.as_bytes(), salt, iterations).to_vec(),
        }
    }
}

impl ScramCredentials {
    pub fn get(&self, m: Mechanism) -> Option<&ScramCredential> {
        match m {
            Mechanism::Sha256 => self.sha256.as_ref(),
            Mechanism::Sha512 => self.sha512.as_ref(),
        }
    }

    /// Sets (or, with `None`, removes) the credential of `m`.
    pub fn set(&mut self, m: Mechanism, credential: Option<ScramCredential>) {
        match m {
            Mechanism::Sha256 => self.sha256 = credential,
            Mechanism::Sha512 => self.sha512 = credential,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.sha256.is_none() && self.sha512.is_none()
    }
}

/// New credentials of `secret`, each with a fresh random salt.
pub fn credentials(secret: &str) -> ScramCredentials {
    let salt = || {
        let mut s = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut s);
        s
    };
    ScramCredentials {
        sha256: Some(derive(Mechanism::Sha256, secret, &salt(), ITERATIONS)),
        sha512: Some(derive(Mechanism::Sha512, secret, &salt(), ITERATIONS)),
    }
}

/// The credential of `secret` with `salt` and `iterations`.
pub fn derive(m: Mechanism, secret: &str, salt: &[u8], iterations: u32) -> ScramCredential {
    from_salted_password(m, salt, iterations, &m.salted_password(secret, salt, iterations))
}

/// The credential of a password a client salted itself (`SaltedPassword`, as
/// AlterUserScramCredentials sends it): only the keys derived from it are kept.
pub fn from_salted_password(m: Mechanism, salt: &[u8], iterations: u32, salted: &[u8]) -> ScramCredential {
    let client_key = m.hmac(salted, b"Client Key");
    ScramCredential {
        salt: B64.encode(salt),
        iterations,
        stored_key: B64.encode(m.hash(&client_key)),
        server_key: B64.encode(m.hmac(salted, b"Server Key")),
    }
}

/// Checks stored credentials as they arrive in a command: each one [`validate_one`],
/// and at least one.
pub fn validate(c: &ScramCredentials) -> Result<(), String> {
    if c.is_empty() {
        return Err("SCRAM credentials name no mechanism".into());
    }
    for m in Mechanism::ALL {
        if let Some(cred) = c.get(m) {
            validate_one(m, cred)?;
        }
    }
    Ok(())
}

/// Checks one credential: [`ITERATIONS`] to [`MAX_ITERATIONS`], and base64 that decodes.
pub fn validate_one(m: Mechanism, cred: &ScramCredential) -> Result<(), String> {
    if !(ITERATIONS..=MAX_ITERATIONS).contains(&cred.iterations) {
        return Err(format!(
            "{} iterations must be {ITERATIONS} to {MAX_ITERATIONS}, got {}",
            m.name(),
            cred.iterations
        ));
    }
    for (what, v) in [
        ("salt", &cred.salt),
        ("stored_key", &cred.stored_key),
        ("server_key", &cred.server_key),
    ] {
        if !B64.decode(v).is_ok_and(|b| !b.is_empty()) {
            return Err(format!("{} {what} is not base64", m.name()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil", salt
    // "W22ZaJ0SNY7soEsUEjb6gQ==", 4096 iterations; its ServerSignature is derived from
    // the ServerKey computed here, so the stored keys match the RFC's exchange.
    #[test]
    fn the_rfc_7677_example_derives_its_keys() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let c = derive(Mechanism::Sha256, "pencil", &salt, 4096);
        let auth = "n=user,r=rOprNGfwEbeRWgbNEkqO,\
                    r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,\
                    c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server_signature = Mechanism::Sha256.hmac(&B64.decode(&c.server_key).unwrap(), auth.as_bytes());
        assert_eq!(
            B64.encode(server_signature),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        assert!(validate(&credentials("s3cret")).is_ok());
    }

    // Issue 59: a password the client salted itself (AlterUserScramCredentials) keeps the
    // same keys as the secret salted here, and a credential is refused outside Kafka's
    // iteration bounds or with no mechanism left.
    #[test]
    fn a_client_salted_password_derives_the_same_keys_and_bounds_are_checked() {
        let salt = b"0123456789abcdef";
        for m in Mechanism::ALL {
            let salted = m.salted_password("pencil", salt, 8192);
            assert_eq!(
                from_salted_password(m, salt, 8192, &salted),
                derive(m, "pencil", salt, 8192)
            );
            assert!(validate_one(m, &derive(m, "p", salt, MAX_ITERATIONS)).is_ok());
            let few = validate_one(m, &derive(m, "p", salt, ITERATIONS - 1)).unwrap_err();
            assert!(few.contains("4096 to 16384"), "{few}");
            assert!(validate_one(m, &derive(m, "p", salt, MAX_ITERATIONS + 1)).is_err());
        }
        let mut c = credentials("s");
        c.set(Mechanism::Sha256, None);
        assert!(validate(&c).is_ok() && c.get(Mechanism::Sha256).is_none());
        c.set(Mechanism::Sha512, None);
        assert!(validate(&c).unwrap_err().contains("no mechanism"));
    }
}
