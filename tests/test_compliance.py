"""Personal data in rendered prompts: found per entity type, redacted, pseudonymized or blocked
as the spec says, never sent, never recorded, and put back into outputs where pseudonymized."""

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from llm_assets import steps
from llm_assets.compliance.detect import scan
from llm_assets.compliance.policy import restore, screen
from llm_assets.compliance.spec import DEFAULT_PII, ENTITIES, ComplianceSpec
from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import StepFailed
from llm_assets.items.tokens import counter_for
from llm_assets.resources.ledger import metadata, output_table
from llm_assets.spec.load import parse_spec
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, Harness, make_harness, review_spec, truthful

SAMPLES: dict[str, list[str]] = {
    "email": ["jane.doe@example.com", "j.smith+billing@mail.example.co.uk"],
    "phone": ["+1 415-555-0132", "(415) 555-0132", "+44 20 7946 0958", "+49 30 12345678"],
    "card": ["4111 1111 1111 1111", "5555-5555-5555-4444", "378282246310005"],
    "iban": [
        "DE89 3704 0044 0532 0130 00",
        "GB82 WEST 1234 5698 7654 32",
        "FR1420041010050500013M02606",
    ],
    "national_id": ["536-22-1234"],
    "ip_address": ["192.168.10.23", "2001:db8::8a2e:370:7334"],
    "credential": [
        "AKIA4XQ7R2PLM3N8KD6Y",
        "sk-proj-Xk3v9QmLw2Rb7TnY8pZc4HdJf6GsA1EuW0oKqVx5MiNl",
        "sk-ant-api03-Zq8Wm3Kp0Lr7Tb2Nx6Vc9Hy4Jd1Gs5Fa-AbCdEfGhIjKl_mnopQR",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "xoxb-2048365123-7623984712-AbCdEfGhIjKlMnOpQrStUvWx",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7xQ\n-----END RSA PRIVATE KEY-----",
        "postgres://admin:s3cretPw@db.internal:5432/app",
    ],
}
CASES = [(entity, value) for entity, values in SAMPLES.items() for value in values]

NOT_PERSONAL = [
    "Order #100123 was placed on 2026-11-02 at 14:30 and is still not here.",
    "The app version 2.3.14 crashes; build 20261102 too.",
    "Invoice INV-2026-004512 shows $1,234.56 instead of $999.00, a 30% markup.",
    "Tracking number 1Z999AA10123456784 says out for delivery since 11/02/2026.",
    "Ticket T00012345, order 1234567890123, SKU AB-1234-XY.",
    "The card number 4111 1111 1111 1112 was refused (it fails the check digit).",
    "Our password policy changed; the new password is rejected every time.",
]


def _policy(**actions: str) -> dict[str, Any]:
    return ComplianceSpec.model_validate({"pii": actions}).pii


@pytest.mark.parametrize(("entity", "value"), CASES)
def test_each_entity_type_is_found_where_it_is(entity: str, value: str) -> None:
    text = f"Hello, please look at this: {value} — thanks."
    (found,) = scan([text])
    assert [(f.entity, f.value) for f in found] == [(entity, value)]


@pytest.mark.parametrize("text", NOT_PERSONAL)
def test_order_numbers_dates_versions_and_prices_are_not_personal_data(text: str) -> None:
    assert scan([text]) == [[]]


@pytest.mark.parametrize(("entity", "value"), CASES)
def test_each_action_does_what_it_says(entity: str, value: str) -> None:
    text = f"Contact: {value} or please call back."
    placeholder = f"<{entity.upper()}_1>"

    (allowed,) = screen([text], _policy(**{entity: "allow"}))
    assert (allowed.text, allowed.blocked, allowed.found) == (text, (), ((f"{entity}:allow", 1),))

    (redacted,) = screen([text], _policy(**{entity: "redact"}))
    assert redacted.text == f"Contact: {placeholder} or please call back."
    assert redacted.pseudonyms == ()

    (pseudonymized,) = screen([text], _policy(**{entity: "pseudonymize"}))
    assert pseudonymized.text == redacted.text
    assert pseudonymized.pseudonyms == ((placeholder, value),)

    (blocked,) = screen([text], _policy(**{entity: "block"}))
    assert (blocked.text, blocked.blocked) == (None, (entity,))
    assert blocked.found == ((f"{entity}:block", 1),)


def test_an_iban_followed_by_a_word_in_capitals_is_still_found() -> None:
    (found,) = scan(["Pay to DE89 3704 0044 0532 0130 00 ASAP please"])
    assert [(f.entity, f.value) for f in found] == [("iban", "DE89 3704 0044 0532 0130 00")]


def test_a_value_twice_is_one_placeholder_and_two_values_are_two() -> None:
    text = "Write to a@example.com or b@example.org; a@example.com is the main one."
    (screened,) = screen([text], _policy(email="pseudonymize"))
    assert screened.text == "Write to <EMAIL_1> or <EMAIL_2>; <EMAIL_1> is the main one."
    assert dict(screened.pseudonyms) == {"<EMAIL_1>": "a@example.com", "<EMAIL_2>": "b@example.org"}
    assert screened.found == (("email:pseudonymize", 3),)


def test_one_blocked_type_blocks_the_item_and_names_only_the_types() -> None:
    text = "Mail me at jane@example.com, card 4111 1111 1111 1111, key AKIA4XQ7R2PLM3N8KD6Y"
    (screened,) = screen([text], dict(DEFAULT_PII))
    assert screened.text is None
    assert screened.blocked == ("card", "credential")
    assert dict(screened.found) == {"card:block": 1, "credential:block": 1, "email:redact": 1}


def test_the_default_policy_redacts_contact_data_and_blocks_cards_and_credentials() -> None:
    assert set(DEFAULT_PII) == set(ENTITIES)
    assert {e for e, a in DEFAULT_PII.items() if a == "block"} == {"card", "credential"}
    assert DEFAULT_PII["email"] == DEFAULT_PII["phone"] == "redact"
    assert ComplianceSpec.model_validate({"pii": {"email": "allow"}}).pii == {
        **DEFAULT_PII,
        "email": "allow",
    }


def test_chunked_scanning_keeps_each_finding_in_its_own_text() -> None:
    texts = ["nothing here", "mail x@example.com", "", "call +1 415-555-0132 now", "x@example.com"]
    found = scan(texts)
    assert [[(f.entity, f.start, f.end) for f in fs] for fs in found] == [
        [],
        [("email", 5, 18)],
        [],
        [("phone", 5, 20)],
        [("email", 0, 13)],
    ]


def test_restore_puts_values_back_at_any_depth() -> None:
    names = {"<EMAIL_1>": "a@example.com", "<PHONE_1>": "+1 415-555-0132"}
    output = {"summary": "Reply to <EMAIL_1> (<PHONE_1>)", "tags": ["<EMAIL_1>", "x"], "n": 3}
    assert restore(output, names) == {
        "summary": "Reply to a@example.com (+1 415-555-0132)",
        "tags": ["a@example.com", "x"],
        "n": 3,
    }
    assert restore("unknown <EMAIL_9> stays", names) == "unknown <EMAIL_9> stays"


# A day through the pipeline: reviews with personal data in them, the OpenAI fake answering.

EMAIL = "marta.kowalska@example.org"
PHONE = "+44 20 7946 0958"
CARD = "4111 1111 1111 1111"
KEY = "sk-proj-Xk3v9QmLw2Rb7TnY8pZc4HdJf6GsA1EuW0oKqVx5MiNl"
PERSONAL_REVIEWS = {
    "R-PII-EMAIL": f"The blender is great, write to {EMAIL}. Order 1900 arrived.",
    "R-PII-PHONE": f"The kettle is awful, call me on {PHONE}. Order 1901 arrived.",
    "R-PII-CARD": f"I love it but you charged my card {CARD} twice. Order 1902 arrived.",
    "R-PII-KEY": f"Bad router. My config has api_key {KEY} in it. Order 1903 arrived.",
}
NEVER_SENT = (PHONE, CARD, KEY, "4111111111111111")


def _add_reviews(harness: Harness, reviews: dict[str, str]) -> None:
    source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
    with source.open("a") as out:
        for review_id, text in reviews.items():
            row = {"review_id": review_id, "created_at": f"{DAY}T12:00:00Z", "text": text}
            out.write(json.dumps(row) + "\n")


@pytest.fixture
def sent(fake: FakeOpenAI) -> list[str]:
    """The user texts the fake provider received, as it received them."""
    received: list[str] = []

    def answer(body: dict[str, Any]) -> str:
        received.append(user_text(body))
        return truthful(body)

    fake.responder = answer
    return received


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    compliance = {"pii": {"email": "pseudonymize"}, "max_blocked_rate": 0.2}
    for harness in make_harness(tmp_path, database_url, fake, compliance=compliance):
        _add_reviews(harness, PERSONAL_REVIEWS)
        yield harness


def _ledger_text(harness: Harness) -> str:
    """Every row of every ledger table, as text."""
    chunks = []
    with harness.ledger.engine.connect() as conn:
        for table in metadata.sorted_tables:
            if table.name == "llm_batch_pseudonym":
                continue
            chunks += [repr(tuple(row)) for row in conn.execute(sa.select(table))]
    return "\n".join(chunks)


def _files_text(root: Path) -> str:
    return "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file()
    )


pytestmark = [pytest.mark.fake_server("openai")]


@pytest.mark.one_database
def test_a_day_sends_no_blocked_or_redacted_value_and_restores_pseudonyms(
    harness: Harness, sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    outcome = harness.run_day()

    assert outcome.open_items == 0
    rows = {r["source_id"]: r for r in harness.rows().values()}
    for source_id in ("R-PII-CARD", "R-PII-KEY"):
        row = rows[source_id]
        assert (row["status"], row["error_class"], row["attempts"]) == (
            "dead_letter",
            "compliance",
            0,
        )
        assert row["error_code"] == "personal_data_blocked"
    assert "card" in rows["R-PII-CARD"]["error_message"]
    assert "credential" in rows["R-PII-KEY"]["error_message"]
    assert outcome.dead_letters_by_class == {"compliance": 2}
    assert outcome.personal_data == {
        "card:block": 1,
        "credential:block": 1,
        "email:pseudonymize": 1,
        "phone:redact": 1,
    }

    # What the provider received: placeholders, never a blocked or redacted value.
    everything_sent = "\n".join(sent)
    assert "<PHONE_1>" in everything_sent and "<EMAIL_1>" in everything_sent
    assert len(sent) == len(harness.truth) + 2
    for value in (*NEVER_SENT, EMAIL):
        assert value not in everything_sent

    # Nothing of them in request files, the ledger, logs or Dagster's events.
    artifacts = _files_text(harness.home / "artifacts" / "shards")
    assert "<PHONE_1>" in artifacts
    events = "\n".join(
        str(entry) for run_id in outcome.run_ids for entry in harness.instance.all_logs(run_id)
    )
    for where, text in {
        "request files": artifacts,
        "ledger": _ledger_text(harness),
        "log": caplog.text,
        "dagster events": events,
    }.items():
        for value in NEVER_SENT:
            assert value not in text, f"{value!r} in the {where}"

    # The pseudonymized e-mail is back in the validated output, where the model echoed it.
    with harness.ledger.engine.connect() as conn:
        outputs = {
            r.custom_id: json.loads(r.output_json)
            for r in conn.execute(sa.select(output_table.c.custom_id, output_table.c.output_json))
        }
    email_item = rows["R-PII-EMAIL"]["custom_id"]
    assert outputs[email_item]["summary"] == f"The blender is great, write to {EMAIL}"
    phone_item = rows["R-PII-PHONE"]["custom_id"]
    assert outputs[phone_item]["summary"] == "The kettle is awful, call me on <PHONE_1>"

    # The estimate counts the prompt as sent, placeholder and all.
    sent_phone = "The kettle is awful, call me on <PHONE_1>. Order 1901 arrived."
    counter = counter_for(harness.spec)
    assert rows["R-PII-PHONE"]["estimated_input_tokens"] == counter.request(
        harness.spec.prompt.system, sent_phone
    )

    # The counts, never the values, are request_shards' metadata and its compliance check.
    materialization = harness.instance.get_latest_materialization_event(
        asset_key(harness.spec, "request_shards")
    )
    assert materialization is not None
    meta = materialization.asset_materialization.metadata
    assert meta["personal_data_found"].value == {
        "card:block": 1,
        "credential:block": 1,
        "email:pseudonymize": 1,
        "phone:redact": 1,
    }
    assert meta["compliance_dead_letters"].value == 2


@pytest.mark.one_database
def test_too_many_blocked_items_hold_the_day_and_nothing_is_sent(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, sent: list[str]
) -> None:
    compliance = {"max_blocked_rate": 0.01}
    for harness in make_harness(tmp_path, database_url, fake, compliance=compliance):
        _add_reviews(harness, PERSONAL_REVIEWS)
        with pytest.raises(StepFailed) as failed:
            harness.run_day()
        assert failed.value.gate == "compliance"
        assert "compliance.max_blocked_rate" in str(failed.value)
        assert sent == [] and fake.store.all_batches() == []

        result = harness.materialize("request_shards")
        (check,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "compliance"]
        assert not check.passed
        assert check.metadata["blocked_items"].value == 2


@pytest.mark.one_database
def test_a_policy_change_and_a_requeue_send_a_blocked_item_pseudonymized(
    harness: Harness, sent: list[str]
) -> None:
    harness.run_day()
    rows = {r["source_id"]: r for r in harness.rows().values()}
    card_item = rows["R-PII-CARD"]["custom_id"]

    policy = {"pii": {"email": "pseudonymize", "card": "pseudonymize"}, "max_blocked_rate": 0.2}
    harness.spec = harness.spec.model_copy(
        update={"compliance": ComplianceSpec.model_validate(policy)}
    )
    context = steps.StepContext(
        harness.spec, DAY, harness.ledger, harness.storage, harness.provider, created_by="test"
    )
    requeued = steps.requeue_dead_letters(context, classes={"compliance"})
    # The card is now sent as a placeholder; the key is still blocked.
    assert requeued.requeued == 1
    assert list(requeued.still_invalid) == [rows["R-PII-KEY"]["custom_id"]]
    sent.clear()
    outcome = harness.run_day()

    assert outcome.open_items == 0
    (card_text,) = [text for text in sent if "<CARD_1>" in text]
    assert CARD not in card_text and card_text.startswith("I love it but you charged my card")
    row = harness.rows()[card_item]
    assert (row["status"], row["attempts"]) == ("succeeded", 1)
    assert harness.ledger.pseudonyms_of(harness.job_id(), [card_item]) == {
        card_item: {"<CARD_1>": CARD}
    }


def test_a_key_in_the_system_prompt_is_a_spec_problem_named_by_type(tmp_path: Path) -> None:
    spec = review_spec("openai", "gpt-4o-mini")
    spec["prompt"] = {
        **spec["prompt"],
        "system": f"Use the key {KEY} when you call the tool. Label the review.",
        "template": "Reply to support@example.com about: {text}",
    }
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(spec))
    _, problems = parse_spec(path)
    reasons = {p.field: p.reason for p in problems}
    assert reasons["prompt.system"].startswith("holds credential, which would go with every item")
    assert reasons["prompt.template"].startswith("holds email")
    assert KEY not in str(problems) and "support@example.com" not in str(problems)

    spec["compliance"] = {"pii": {"email": "allow"}}
    spec["prompt"]["system"] = "Label the review."
    path.write_text(yaml.safe_dump(spec))
    assert parse_spec(path)[1] == []
