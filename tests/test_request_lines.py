"""Request lines serialized from a per-spec template are the lines `request_line` describes."""

import json

import pytest

from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.base import BatchProvider, RequestItem
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from llm_assets.resources.providers.online import OnlineProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.spec.model import PipelineSpec
from tests.harness import review_spec

HARD_TEXTS = ["plain", 'a "quote", a \\ backslash\nand 日本語 \u0000 \ue000', ""]


@pytest.mark.parametrize(
    ("provider", "name", "model"),
    [
        (OpenAIBatchProvider(), "openai", "gpt-4o-mini"),
        (BedrockBatchProvider(), "bedrock", "amazon.nova-lite-v1:0"),
        (BedrockBatchProvider(), "bedrock", "anthropic.claude-3-5-haiku-20241022-v1:0"),
        (AnthropicBatchProvider(), "anthropic", "claude-3-5-haiku-20241022"),
        (OnlineProvider(), "online", "gpt-4o-mini"),
    ],
)
def test_encoded_lines_equal_the_request_line(
    provider: BatchProvider, name: str, model: str
) -> None:
    spec = PipelineSpec.model_validate(review_spec(name, model))
    other = spec.model_copy(update={"prompt": spec.prompt.model_copy(update={"system": "New"})})
    for current in (spec, other, spec):  # a changed spec is never served an old template
        for user in HARD_TEXTS:
            item = RequestItem(
                custom_id="20261102_R-1_abcdef", system=current.prompt.system, user=user
            )
            line = provider.encode_request(current, item)
            assert json.loads(line) == provider.request_line(current, item)
    # An item whose system prompt is not the spec's is serialized on its own.
    odd = RequestItem(custom_id="20261102_R-2_abcdef", system="Other", user="x")
    assert json.loads(provider.encode_request(spec, odd)) == provider.request_line(spec, odd)


def test_json_strings_are_the_bytes_json_writes_for_every_character() -> None:
    """Request lines fill their template with orjson: for every character (in a string with
    neighbours, so escapes are not at an edge) the bytes json.dumps(ensure_ascii=False)
    wrote before, and a lone surrogate fails as it did there."""
    from llm_assets.util.fastjson import json_string

    every = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    for start in range(0, len(every), 4096):
        text = "x".join(every[start : start + 4096])
        assert json_string(text) == json.dumps(text, ensure_ascii=False).encode()
    for text in HARD_TEXTS:
        assert json_string(text) == json.dumps(text, ensure_ascii=False).encode()
    with pytest.raises(UnicodeEncodeError):
        json.dumps("lone \ud800", ensure_ascii=False).encode()
    with pytest.raises(UnicodeEncodeError):
        json_string("lone \ud800")


@pytest.mark.parametrize("provider", [OpenAIBatchProvider, BedrockBatchProvider])
def test_retry_lines_are_found_as_reading_every_line_finds_them(
    provider: type[BatchProvider],
) -> None:
    """The retry round reads each wanted line's custom_id in place from blocks of lines,
    under the provider's id field (custom_id, Bedrock's recordId); whatever the lines look
    like (an escape in the id, the id not first, the other provider's id field first, no
    newline at the end) and however the file is cut, it finds the lines, in order, that
    reading every line with line_custom_id finds."""
    import random

    from llm_assets.resources.storage import line_blocks, split_lines
    from llm_assets.steps import line_custom_id, lines_with_ids

    field = provider.line_id_field
    other = "recordId" if field == "custom_id" else "custom_id"
    rng = random.Random(5)
    kinds = [
        lambda n: json.dumps({field: f"20261102_T{n:05d}_ab12", "body": {"x": "y"}}),
        lambda n: json.dumps({field: f'q"{n}\\x', "body": {}}),
        lambda n: json.dumps({"method": "POST", field: f"late-{n}", "url": "/v1"}),
        lambda n: json.dumps({field: f"日本-{n}"}, ensure_ascii=False),
        lambda n: json.dumps({field: f"日本-{n}"}),
        lambda n: json.dumps({other: f"decoy-{n}", field: f"real-{n}"}),
    ]
    for _ in range(300):
        lines = [rng.choice(kinds)(n).encode() for n in range(rng.randint(1, 40))]
        data = b"\n".join(lines) + rng.choice([b"\n", b""])
        ids = [line_custom_id(line, id_field=field) for line in split_lines([data])]
        assert not any(cid.startswith("decoy") for cid in ids)
        wanted = set(rng.sample(ids, rng.randint(0, len(ids))))
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 8)))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        expected = [
            (cid, line)
            for line in split_lines([data])
            if (cid := line_custom_id(line, id_field=field)) in wanted
        ]
        found = lines_with_ids(line_blocks(chunks), wanted, id_field=field)
        assert list(found) == expected


CACHED_SYSTEM = "Label the review. Examples:\n" + "Review: fine.\nAnswer: positive\n" * 200


@pytest.mark.parametrize(
    ("provider", "name", "model"),
    [
        (OpenAIBatchProvider(), "openai", "gpt-4o-mini"),
        (GeminiBatchProvider(), "gemini", "gemini-2.5-flash"),
        (AnthropicBatchProvider(), "anthropic", "claude-sonnet-4-5"),
    ],
)
def test_a_cached_prefix_is_the_same_bytes_in_every_line(
    provider: BatchProvider, name: str, model: str
) -> None:
    """With `prompt.cache`, the system prompt goes first to the model and every line is the
    same bytes but for its custom_id and user text, so a provider that caches a repeated
    prefix by itself (OpenAI, Gemini) caches it; Anthropic's lines mark it, with the TTL."""
    from llm_assets.util.fastjson import json_string

    overrides = {"prompt": {"system": CACHED_SYSTEM, "cache": {"ttl": "5m"}}}
    spec = PipelineSpec.model_validate(review_spec(name, model, **overrides))
    users = ["The kettle is great.", 'A "quoted" review\nover two lines', "日本語のレビュー"]
    shapes = set()
    for n, user in enumerate(users):
        custom_id = f"20261102_R-{n}_abcdef"
        item = RequestItem(custom_id=custom_id, system=spec.prompt.system, user=user)
        line = provider.encode_request(spec, item)
        assert line.count(json_string(CACHED_SYSTEM)) == 1
        shapes.add(line.replace(json_string(custom_id), b"ID").replace(json_string(user), b"U"))
        parsed = json.loads(line)
        if name == "openai":
            assert parsed["body"]["messages"][0] == {"role": "system", "content": CACHED_SYSTEM}
        elif name == "gemini":
            assert parsed["request"]["systemInstruction"] == {"parts": [{"text": CACHED_SYSTEM}]}
        else:
            marker = {"type": "ephemeral", "ttl": "5m"}
            assert parsed["params"]["system"] == [
                {"type": "text", "text": CACHED_SYSTEM, "cache_control": marker}
            ]
    assert len(shapes) == 1
