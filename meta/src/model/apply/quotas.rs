//! Client quotas (issue 59): AlterClientQuotas sets and removes one entity's quotas; an
//! entity left with none has no row.

use super::{reject, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::quotas::{invalid_value, QuotaEntity, QuotaKey, QuotaName, QuotaRow, QuotaValue};
use crate::model::state::RowKey;
use std::collections::BTreeMap;

impl Txn<'_> {
    pub(super) fn alter_client_quotas(
        &mut self,
        proposer: &Proposer,
        entity: &QuotaEntity,
        set: &BTreeMap<QuotaKey, QuotaValue>,
        remove: &[QuotaKey],
    ) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "quotas are set by users, not nodes",
            ));
        }
        if entity.user.is_none() && entity.client_id.is_none() {
            return Err(reject(
                RejectCode::InvalidArgument,
                "a quota is for a user, a client id, or both",
            ));
        }
        if [&entity.user, &entity.client_id]
            .into_iter()
            .any(|side| matches!(side, Some(QuotaName::Name(n)) if n.is_empty()))
        {
            return Err(reject(RejectCode::InvalidArgument, "a quota entity's name is empty"));
        }
        if let Some(why) = set.iter().find_map(|(k, v)| invalid_value(*k, v.get())) {
            return Err(reject(RejectCode::InvalidArgument, why));
        }
        if let Some(k) = remove.iter().find(|k| set.contains_key(k)) {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("{} is both set and removed", k.name()),
            ));
        }
        let mut values = self
            .state
            .quotas
            .get(entity)
            .map(|r| r.values.clone())
            .unwrap_or_default();
        for k in remove {
            values.remove(k);
        }
        values.extend(set.iter().map(|(k, v)| (*k, *v)));
        if values.is_empty() {
            self.state.quotas.remove(entity);
        } else {
            self.state.quotas.insert(
                entity.clone(),
                QuotaRow {
                    entity: entity.clone(),
                    values,
                },
            );
        }
        self.touch(RowKey::Quota(entity.clone()));
        Ok(Applied::Done)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::apply::test_log::{op, Log};
    use crate::model::command::{Applied, RejectCode};
    use crate::model::quotas::*;
    use crate::model::Command;

    fn alice() -> QuotaEntity {
        QuotaEntity {
            user: Some(QuotaName::Name("alice".into())),
            client_id: None,
        }
    }

    #[test]
    fn quotas_are_set_replaced_and_removed_per_entity() {
        let mut log = Log::new();
        let set = |key, v: f64| Command::AlterClientQuotas {
            entity: alice(),
            set: [(key, QuotaValue::new(v))].into(),
            remove: vec![],
        };
        assert_eq!(log.apply(op(), set(QuotaKey::ProducerByteRate, 1e6)), Ok(Applied::Done));
        assert_eq!(log.apply(op(), set(QuotaKey::ConsumerByteRate, 2e6)), Ok(Applied::Done));
        assert_eq!(log.apply(op(), set(QuotaKey::ProducerByteRate, 3e6)), Ok(Applied::Done));
        let row = &log.meta.state.quotas[&alice()];
        assert_eq!(row.values[&QuotaKey::ProducerByteRate].get(), 3e6);
        assert_eq!(row.values[&QuotaKey::ConsumerByteRate].get(), 2e6);
        let remove = Command::AlterClientQuotas {
            entity: alice(),
            set: Default::default(),
            remove: vec![QuotaKey::ProducerByteRate, QuotaKey::ConsumerByteRate],
        };
        assert_eq!(log.apply(op(), remove), Ok(Applied::Done));
        assert!(log.meta.state.quotas.is_empty(), "no quota left, no row");
        assert_eq!(
            log.apply(op(), set(QuotaKey::ProducerByteRate, -1.0)),
            Err(RejectCode::InvalidArgument)
        );
        let nobody = Command::AlterClientQuotas {
            entity: QuotaEntity {
                user: None,
                client_id: None,
            },
            set: [(QuotaKey::ProducerByteRate, QuotaValue::new(1.0))].into(),
            remove: vec![],
        };
        assert_eq!(log.apply(op(), nobody), Err(RejectCode::InvalidArgument));
    }

    #[test]
    fn the_state_keeps_quotas_through_its_json() {
        let mut log = Log::new();
        let cmd = Command::AlterClientQuotas {
            entity: alice(),
            set: [(QuotaKey::RequestPercentage, QuotaValue::new(12.5))].into(),
            remove: vec![],
        };
        log.apply(op(), cmd).unwrap();
        let json = serde_json::to_string(&log.meta.state).unwrap();
        let back: crate::model::State = serde_json::from_str(&json).unwrap();
        assert_eq!(back.quotas, log.meta.state.quotas);
    }
}
