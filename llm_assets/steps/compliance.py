"""The compliance gate of a day: how many of its items the personal-data policy blocked,
against `compliance.max_blocked_rate`. request_shards shows it as a blocking check and
provider_batches refuses to submit while it fails: many blocked items mean the policy or the
source is wrong, and what is left of the day should not go out until someone has looked."""

from pydantic import BaseModel

from llm_assets.steps.context import StepContext


class ComplianceGate(BaseModel):
    blocked: int
    items: int
    max_blocked_rate: float
    passed: bool
    reason: str

    @property
    def rate(self) -> float:
        return self.blocked / self.items if self.items else 0.0


def compliance_gate(ctx: StepContext) -> ComplianceGate:
    limit = ctx.spec.compliance.max_blocked_rate
    blocked, items = ctx.ledger.compliance_counts(ctx.job().job_id)
    rate = blocked / items if items else 0.0
    passed = rate <= limit
    share = f"{blocked} of {items} items ({rate:.1%})"
    if passed:
        reason = f"{share} blocked by compliance.pii; at most {limit:.1%} allowed"
    else:
        reason = (
            f"{ctx.spec.name} {ctx.day}: {share} blocked by compliance.pii, over "
            f"compliance.max_blocked_rate {limit:.1%}; nothing is submitted. `llm-assets "
            f"dead-letter {ctx.spec.name} --date {ctx.day}` lists them with the entity types "
            "found; fix the source or the policy, or raise the rate"
        )
    return ComplianceGate(
        blocked=blocked, items=items, max_blocked_rate=limit, passed=passed, reason=reason
    )
