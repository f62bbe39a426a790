"""Personal data as people write it: Unicode forms, obfuscations, the number formats of many
countries, and the ordinary numbers around them (versions, file names, order numbers) that are
not personal data. A finding replaces its whole span in the original text; scanning takes time
linear in the text whatever it holds, and a prompt too long to scan is blocked unscanned."""

import json
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_assets.cli.main import main
from llm_assets.compliance import normalize
from llm_assets.compliance.detect import scan
from llm_assets.compliance.normalize import view
from llm_assets.compliance.policy import redacted, screen
from llm_assets.compliance.spec import DEFAULT_PII
from llm_assets.spec.load import parse_spec
from llm_assets.steps.tables import case_table
from llm_assets.util.secrecy import mask_url
from tests import test_compliance
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import DAY, Harness, make_harness, review_spec

ZWSP, NBSP, THIN, SOFT_HYPHEN, NB_HYPHEN = "\u200b", "\u00a0", "\u2009", "\u00ad", "\u2011"
CARD = "4111111111111111"


def _groups(separator: str, digits: str = CARD) -> str:
    return separator.join(digits[i : i + 4] for i in range(0, len(digits), 4))


FULL_WIDTH = str.maketrans("0123456789@", "０１２３４５６７８９＠")

# (entity, the value as written, the text around it): the finding must cover the value exactly.
FOUND = [
    ("card", _groups(" ").translate(FULL_WIDTH), "Karte {} bitte sperren"),
    ("card", _groups(NBSP), "my card {} was charged twice"),
    ("card", _groups(THIN), "my card {} was charged twice"),
    ("card", _groups(ZWSP), "my card {} was charged twice"),
    ("card", _groups(SOFT_HYPHEN), "card {} expired"),
    ("card", _groups("."), "card {} expired"),
    ("card", "4111" + ZWSP + "1111 1111 1111", "card {} expired"),
    ("email", "anna.schmidt＠example.com", "Mail an {} bitte"),
    ("email", "jörg.müller@bücher.de", "schreib an {} heute"),
    ("email", "jo\u0308rg@mu\u0308ller.de", "schreib an {} heute"),
    ("email", "用户@例子.广告", "请联系 {} 谢谢"),
    ("email", "marta [at] example [dot] com", "reach me at {} please"),
    ("email", "marta(at)example.de", "reach me at {} please"),
    ("email", "marta at example dot org", "reach me: {} thanks"),
    ("phone", "+49 (0)30 1234567", "Tel. {} (Büro)"),
    ("phone", "+44 (0) 20 7946 0958", "ring {} after 5"),
    ("phone", "030 1234567", "Phone no. {} any time"),
    ("phone", "030" + NBSP + "1234567", "Telefon: {} bitte"),
    ("iban", "de89 3704 0044 0532 0130 00", "iban: {} thanks"),
    ("iban", "DE89-3704-0044-0532-0130-00", "IBAN {} thanks"),
    ("iban", "GB82" + NBSP + "WEST" + NBSP + "1234" + NBSP + "5698" + NBSP + "7654 32", "to {}"),
    ("national_id", "536228726", "SSN{} on file"),
    ("national_id", "536" + NB_HYPHEN + "22" + NB_HYPHEN + "8726", "SSN: {} on file"),
    ("credential", "glpat-Rk7Zp2Qw9Xm4Ln8Vb3Ty", "token {} leaked"),
    ("credential", "xapp-1-A0123ABCD-4567890123-" + "0a1b2c3d4e5f6a7b8c9d" * 3, "slack {} ok"),
    ("credential", "npm_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5", "NPM_TOKEN={}"),
    ("credential", "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgH", "HF token {}"),
    (
        "credential",
        "-----BEGIN OPENSSH\nPRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
        "-----END OPENSSH PRIVATE KEY-----",
        "my key:\n{}\nthanks",
    ),
    (
        "credential",
        "-----BEGIN OPENSSH PRIVA\nTE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
        "-----END OPENSSH PRIVATE KEY-----",
        "pasted from a narrow terminal:\n{}\n",
    ),
    ("credential", "69978cf07604c545b566523d2ad6ff83", "  SECRET_KEY_BASE: {}\n"),
    ("email", "jneumann @ mail.beispiel.de", "schick es an {} bitte"),
    ("email", "राहुल@डाटामेल.भारत", "ईमेल {} पर भेजें"),
    ("credential", "h4EWEgo_2WD-G", "初期パスワードは「{}」です。"),
    ("credential", "ecA0R%+c7GS#Qm", "初始密码是{}，登录后请修改。"),
    ("credential", "Fiets_Tulp31", "Wachtwoord van de beheerpagina is {} als je wilt."),
    ("credential", "VptgWlCx0zDD?ETra$k", "Neues Einmalpasswort {} telefonisch durchgegeben"),
    ("credential", "J5ekQNvnN5J", "mysql -u root -p{} -h db inventory"),
    ("credential", "YWRtaW46TTR5PW90JTRYdnhxVFhpPT8kYQ==", "Authorization: Basic {}\n"),
    ("credential", "dAuR4w6HFnjKBKIXmpREx8Fx8XMPjRqmycZQz+i0NqM=", "[Peer]\nPrivateKey = {}\n"),
    ("credential", "redis://:vX*vZVMRFe0S*dbp.D@cache-01.internal:6379/0", "BROKER={}\n"),
    ("national_id", "065225496", '{{"name": "A", "ssn": "{}", "dob": "1987-06-14"}}'),
    ("phone", "08028927212", "電話番号：{}\n"),
    ("credential", "postgres://app:p@ss@w0rd@db.internal:5432/app", "DATABASE_URL={} now"),
    ("credential", "Tr0ub4dor&3", "Passwort: {} (neu)"),
]

NOT_FOUND = [
    "The app says version 10.2.3.4 after the update.",
    "Upgraded to v10.2.3.4 and build 7.1.0.22 yesterday.",
    "See the attached crash-783895424.txt and dump_536228726.log.",
    "Logs are in /var/log/app/2026/11/0301234567/trace.txt.",
    "The page https://shop.example.com/orders/0301234567/items broke.",
    "Order no. 0301234567 never arrived; invoice # 0207946095 too.",
    "Customer number 783895424, please check.",
    "Our key is glpat-xxxxxxxxxxxxxxxxxxxx in the docs, a placeholder.",
    "Set DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/DBNAME first.",
    'api_key = "YOUR_API_KEY", and the token: please reset it.',
    "Gift card balance: £3,342.35 (card ID 4246 8763 0185 5872).",
    "Su pedido n.º 0375322143 salió del almacén.",
    "Ihre Bestellnummer 0518795019 wurde versandt.",
    "Заказ № 0640354968 отправлен.",
    "تم شحن الطلب رقم 0349687923 بتاريخ اليوم",
    "my-internal-lib==8.3.24.210 and image registry.example.com/shop/web:24.14.21.85",
    "Bump version to 16.15.15.64",
    "acme/agent   4.2.1.3   b5eb2a8bc0f1   2 days ago; Firmware-Version 3.10.2.1",
    "Gemäß Ziffer 3.1.2.4 des Rahmenvertrags; Version=13.0.0.0, PublicKeyToken=30ad4fe6b2a6aeed",
    "| order | customer |\n|---|---|\n| 0247472121 | 279026 |\n0396683268,I26-93615,2,19.99",
    "Bestelnummer 0845846365 · klantnummer 65349243 · PO 8308850993",
    "login ok password=******** token=[REDACTED]; DB_PASSWORD=${DB_PASSWORD}",
    "the request was rejected (error code PWD-0042).",
    "MAC=83:2c:bf:b3:6b:d8:70:17:4b:b1:7c:33:86:dd; Serial Number: F6:52:CC:81:8A:AD:3E:62",
    "Use std::chrono and see ab::cd in the header.",
    "git clone git@github.com:acme/infra.git; postgresql://reporting@db-replica.internal:5432/w",
    "2026-03-11T14:22:09.123456+01:00",
]


@pytest.mark.parametrize(("entity", "value", "around"), FOUND)
def test_a_value_written_as_people_write_it_is_found_whole(
    entity: str, value: str, around: str
) -> None:
    text = around.format(value)
    findings = scan([text])[0]

    assert [(f.entity, f.value) for f in findings] == [(entity, value)]
    # Redacted, the value is gone whole: no digit group or invisible character of it is left.
    (screened,) = screen([text], {**DEFAULT_PII, entity: "redact"})
    assert screened.text == around.format(f"<{entity.upper()}_1>")


@pytest.mark.parametrize("text", NOT_FOUND)
def test_versions_file_names_paths_urls_and_order_numbers_stay(text: str) -> None:
    assert scan([text]) == [[]]


def test_a_lower_case_iban_is_an_iban_not_a_card_that_blocks_the_ticket() -> None:
    text = "Please refund to de89 3704 0044 0532 0130 00, thank you."
    (screened,) = screen([text], DEFAULT_PII)
    assert screened.text == "Please refund to <IBAN_1>, thank you."
    assert screened.blocked == ()


def test_a_card_with_a_zero_width_space_inside_is_blocked_whole_not_half_redacted() -> None:
    text = f"card {_groups(ZWSP)} please"
    (screened,) = screen([text], DEFAULT_PII)
    assert screened.text is None and screened.blocked == ("card",)


def test_the_view_maps_every_character_back_to_the_original() -> None:
    text = f"a{ZWSP}ｂ{NBSP}ﬁ e\u0301 ４"
    seen = view(text)
    assert seen.text == "ab fi é 4"
    for start in range(len(seen.text)):
        for end in range(start + 1, len(seen.text) + 1):
            begin, stop = seen.span(start, end)
            assert 0 <= begin < stop <= len(text)
    assert text[slice(*seen.span(3, 5))] == "ﬁ"
    assert text[slice(*seen.span(6, 7))] == "e\u0301"
    assert view("plain ascii").starts is None


def test_the_stored_tables_of_the_view_are_the_scan_of_this_unicode_version() -> None:
    """What the view reads from normalize_tables.json is what scanning every code point
    gives under this Python's Unicode version; another version's file is not used."""
    stored = normalize.stored_tables(unicodedata.unidata_version)
    assert stored is not None, "normalize_tables.json is missing or of another Unicode version"
    assert stored == normalize.scanned_tables()
    assert normalize.stored_tables("1.1.0") is None


# Scanning time grows with the text, never faster: inputs made of what the patterns match
# in part (digit runs, separators, key prefixes, label words) are where a backtracking pattern
# goes quadratic. The ratio of two sizes is measured, not a speed: a linear scan gives 4.

_PIECES = [
    "0", "1", "7", "9", " ", ".", "-", "/", "(", ")", "+", "@", ":", NBSP, ZWSP, "４",
    "eyJ", "password ", "SSN", "://a:b", "[at] ", " dot ", "sk-ant-", "glpat-", "DE89",
    "-----BEGIN RSA PRIVATE KEY-----", "version ", "a", "Z",
]  # fmt: skip


def _cpu_seconds(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        scan([text])
        best = min(best, time.process_time() - started)
    return best


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=12))
def test_scan_time_per_kib_stays_bounded_as_text_grows(pieces: list[str]) -> None:
    unit = "".join(pieces)
    small = unit * (64 * 1024 // len(unit) + 1)
    large = small * 4
    ratio = _cpu_seconds(large) / max(_cpu_seconds(small), 0.002)
    assert ratio < 10, f"{ratio:.1f}× the time for 4× the text of {unit!r}"


def test_a_prompt_over_max_scanned_chars_is_blocked_unscanned() -> None:
    texts = ["short and clean", "x" * 101]
    clean, long = screen(texts, DEFAULT_PII, max_chars=100)
    assert clean.text == "short and clean"
    assert long.text is None
    assert "101 characters, over compliance.max_scanned_chars (100)" in long.unscanned


# Templates: a placeholder is a field's name, nothing more.


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{text:>300000000}", "placeholder {text:>300000000}: no conversion or format spec"),
        ("{text!r}", "placeholder {text!r}: no conversion or format spec"),
        ("{text.__class__}", "placeholder {text.__class__} is not a plain field name"),
        ("{text[0]}", "placeholder {text[0]} is not a plain field name"),
    ],
)
def test_a_template_with_a_format_spec_or_attribute_is_refused(
    tmp_path: Path, template: str, said: str
) -> None:
    spec = review_spec("openai", "gpt-4o-mini")
    spec["prompt"] = {**spec["prompt"], "template": f"Review: {template}"}
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(spec))
    reasons = {p.field: p.reason for p in parse_spec(path)[1]}
    assert reasons["prompt.template"].startswith(said)


def _validate_spec(tmp_path: Path, prompt: dict[str, str]) -> tuple[int, str]:
    spec = review_spec("openai", "gpt-4o-mini")
    spec["prompt"] = {**spec["prompt"], **prompt}
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    result = CliRunner().invoke(main, ["validate-spec", str(path)], env={"COLUMNS": "300"})
    return result.exit_code, " ".join((result.stdout + result.stderr).split())


def test_validate_spec_refuses_a_format_spec_and_a_card_written_with_nbsp(tmp_path: Path) -> None:
    code, said = _validate_spec(tmp_path, {"template": "Review: {text:>300000000}"})
    assert code == 1 and "no conversion or format spec" in said

    card = _groups(NBSP)
    code, said = _validate_spec(tmp_path, {"system": f"Refund card {card} if asked."})
    assert code == 1 and "prompt.system: holds card" in said
    assert "1111" not in said


def test_validate_spec_refuses_a_variant_system_prompt_with_an_nbsp_card(tmp_path: Path) -> None:
    spec = review_spec("openai", "gpt-4o-mini")
    spec["variants"] = {"terse": {"prompt": {"system": f"Refund card {_groups(NBSP)}."}}}
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    result = CliRunner().invoke(main, ["validate-spec", str(path)], env={"COLUMNS": "300"})
    said = " ".join((result.stdout + result.stderr).split())
    assert result.exit_code == 1 and "variants.terse.prompt.system: holds card" in said


# The URL mask: any password, with an unencoded "@" or ":" in it.


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:p@ss@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgresql+psycopg2://u:a@b:c@h/db", "postgresql+psycopg2://u:***@h/db"),
        ("redis://:p@ss@h:6379/0", "redis://:***@h:6379/0"),
        ("s3://u:p@w@bucket/x", "s3://u:***@bucket/x"),
        ("sqlite:////tmp/ledger.db", "sqlite:////tmp/ledger.db"),
    ],
)
def test_the_url_mask_hides_any_password(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_metadata_tables_show_personal_data_as_its_type() -> None:
    table = case_table([{"custom_id": "c1", "summary": "write to anna@example.com"}])
    assert "anna@example.com" not in table and "write to <EMAIL>" in table
    assert redacted(["call 030 1234567", "fine"]) == ["call <PHONE>", "fine"]


# A day through the pipeline with values in Unicode forms: none of them is sent, and the
# pseudonymized e-mail restored into the outputs is not shown in Dagster's metadata.

EMAIL = "agnieszka.nowak＠example.pl"
UNICODE_REVIEWS = {
    "R-U-CARD-FW": f"Zwrot na kartę {_groups(' ').translate(FULL_WIDTH)}, proszę.",
    "R-U-CARD-ZW": f"Charged twice on {_groups(ZWSP)} again.",
    "R-U-EMAIL": f"Great kettle, write to {EMAIL} any time.",
    "R-U-LONG": "A pasted export: " + "0123456789 " * 40,
}


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    compliance = {
        "pii": {"email": "pseudonymize"},
        "max_blocked_rate": 0.5,
        "max_scanned_chars": 400,
    }
    for harness in make_harness(tmp_path, database_url, fake, compliance=compliance):
        source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
        with source.open("a") as out:
            for review_id, text in UNICODE_REVIEWS.items():
                row = {"review_id": review_id, "created_at": f"{DAY}T12:00:00Z", "text": text}
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        yield harness


def _digits(text: str) -> str:
    return "".join(c for c in view(text).text if c.isdigit())


sent = test_compliance.sent
"""The fixture of what the provider received, as it received it."""

pytestmark = [pytest.mark.fake_server("openai")]


@pytest.mark.one_database
def test_a_day_sends_no_value_written_in_unicode_forms_and_shows_none(
    harness: Harness, sent: list[str]
) -> None:
    outcome = harness.run_day()

    assert outcome.open_items == 0
    rows = {r["source_id"]: r for r in harness.rows().values()}
    for source_id in ("R-U-CARD-FW", "R-U-CARD-ZW"):
        assert (rows[source_id]["error_class"], rows[source_id]["error_code"]) == (
            "compliance",
            "personal_data_blocked",
        )
    long = rows["R-U-LONG"]
    assert (long["error_class"], long["error_code"]) == ("compliance", "too_long_to_scan")
    assert "compliance.max_scanned_chars (400)" in long["error_message"]

    everything_sent = "\n".join(sent)
    assert CARD not in _digits(everything_sent)
    assert "<EMAIL_1>" in everything_sent and "example.pl" not in everything_sent

    events = "\n".join(
        str(entry) for run_id in outcome.run_ids for entry in harness.instance.all_logs(run_id)
    )
    assert "<EMAIL>" in events  # the validated preview shows the restored e-mail as its type
    assert "agnieszka" not in events and CARD not in _digits(events)
