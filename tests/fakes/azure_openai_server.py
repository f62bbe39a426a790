"""A fake of Azure OpenAI's Files + Batches API: the OpenAI fake behind Azure's addressing,
spoken to by the official SDK's `AzureOpenAI` client.

What Azure does differently, and this fake with it:

- paths under `/openai/` (`/openai/files`, `/openai/batches/{id}/cancel`), each with an
  `api-version` query parameter: a call without one is not found (404), one with a version
  Azure does not serve is refused (400);
- the key in an `api-key` header, or a Microsoft Entra ID token as `Authorization: Bearer`;
  neither is a 401 in Azure's words;
- request lines and batches name Azure's endpoint paths (`/chat/completions`, no `/v1`), and
  each line's `model` is a deployment: a deployment the resource does not have (or an
  OpenAI-style `/v1/` path) fails the batch while `validating`, as Azure does.

Inside, a batch runs as in the OpenAI fake (its knobs, faults, quota and call log are all
there): the input is translated to OpenAI's paths and models when the batch is created, and
batch objects are translated back on the way out. The call log keeps Azure's paths, and
adds `auth` ("api-key" or "bearer") and `api_version`.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

from tests.fakes.base import Reply, Request
from tests.fakes.openai_model import ApiError
from tests.fakes.openai_server import FakeOpenAI

JSON = dict[str, Any]
API_VERSIONS = frozenset(
    {
        "2024-07-01-preview",
        "2024-08-01-preview",
        "2024-10-01-preview",
        "2024-10-21",
        "2024-12-01-preview",
        "2025-01-01-preview",
        "2025-03-01-preview",
        "2025-04-01-preview",
    }
)
"""Data-plane api-versions that serve the Batch API."""
ENDPOINTS = ("/chat/completions", "/embeddings", "/responses")


def _error(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}})


class FakeAzureOpenAI(FakeOpenAI):
    """The fake server. Knobs beyond the OpenAI fake's:

    deployments: deployment name -> the model it serves (what the OpenAI fake counts and
        answers with). A line naming another deployment fails its batch (`model_not_found`).
    accepted_tokens: when set, the Entra ID tokens a Bearer header may carry (else any).
    """

    server_name: ClassVar[str] = "fake-azure-openai/1"
    url_path: ClassVar[str] = ""

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        super().__init__(state_dir, port=port)
        self.deployments: dict[str, str] = {"gpt-4o-mini": "gpt-4o-mini"}
        self.accepted_tokens: set[str] | None = None

    def response_headers(self, request: Request) -> dict[str, str]:
        return {"apim-request-id": request.request_id, "x-request-id": request.request_id}

    def call_entry(self, request: Request) -> JSON:
        entry = super().call_entry(request)
        version = parse_qs(request.query).get("api-version")
        if version:
            entry["api_version"] = version[-1]
        return entry

    def answer(self, request: Request, log: JSON) -> Reply:
        refused = self._refusal(request, log)
        if refused is not None:
            return refused
        path = request.path
        if not path.startswith("/openai/"):
            return _error(404, "404", "Resource not found")
        inner = "/v1/" + path.removeprefix("/openai/")
        body = request.body
        if request.method == "POST" and inner == "/v1/batches":
            created = self._inner_create(body)
            if isinstance(created, Reply):
                return created
            body = created
        params = {k: v[-1] for k, v in parse_qs(request.query).items()}
        translated = dataclasses.replace(request, path=inner, target=inner, body=body)
        try:
            with self._lock:
                reply = self._route(translated, params, log)
        except ApiError as err:
            return Reply(err.status, err.body)
        if reply.body is not None:
            reply.body = _outward(reply.body)
        return reply

    def _refusal(self, request: Request, log: JSON) -> Reply | None:
        """Azure's answer to a call without a served api-version or without a key."""
        versions = parse_qs(request.query).get("api-version")
        if not versions:
            return _error(404, "404", "Resource not found")
        if versions[-1] not in API_VERSIONS:
            return _error(
                400,
                "BadRequest",
                f"API version not supported: {versions[-1]}",
            )
        key = (request.headers.get("api-key") or "").strip()
        auth = request.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        if key:
            log["auth"] = "api-key"
            return None
        if token and (self.accepted_tokens is None or token in self.accepted_tokens):
            log["auth"] = "bearer"
            return None
        return _error(
            401,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
            "to provide a valid key for an active subscription and use a correct regional API "
            "endpoint for your resource.",
        )

    @staticmethod
    def _inner_create(raw: bytes) -> bytes | Reply:
        """A create-batch body with its Azure endpoint as the OpenAI fake names it; an
        endpoint Azure does not batch (an OpenAI-style `/v1/` one among them) is refused."""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return raw  # the OpenAI fake answers it
        if not isinstance(body, dict) or not isinstance(body.get("endpoint"), str):
            return raw
        endpoint = body["endpoint"]
        if endpoint not in ENDPOINTS:
            return Reply(
                400,
                {
                    "error": {
                        "code": "invalid_value",
                        "message": f"Invalid value: '{endpoint}'. Supported values are: "
                        f"{', '.join(ENDPOINTS)}.",
                        "param": "endpoint",
                    }
                },
            )
        body["endpoint"] = "/v1" + endpoint
        return json.dumps(body).encode()

    def batch_input(self, data: bytes) -> tuple[bytes, list[JSON]]:
        """The input with OpenAI's paths and the deployments' models; a line naming a
        deployment the resource does not have is an error of `validating`."""
        errors: list[JSON] = []
        out: list[bytes] = []
        for number, raw in enumerate(data.split(b"\n"), start=1):
            try:
                line = json.loads(raw)
            except ValueError:
                out.append(raw)
                continue
            if not isinstance(line, dict):
                out.append(raw)
                continue
            if isinstance(line.get("url"), str):
                line["url"] = "/v1" + line["url"]
            body = line.get("body")
            if isinstance(body, dict) and "model" in body:
                deployment = body["model"]
                if deployment in self.deployments:
                    body["model"] = self.deployments[deployment]
                else:
                    errors.append(
                        {
                            "code": "model_not_found",
                            "message": f"The provided model deployment '{deployment}' does not "
                            "exist in the Azure OpenAI resource, or is not a batch deployment.",
                            "param": "body.model",
                            "line": number,
                        }
                    )
            out.append(json.dumps(line).encode())
        return b"\n".join(out), errors


def _outward(body: JSON) -> JSON:
    """A reply's batch objects with Azure's endpoint paths."""
    if body.get("object") == "batch":
        return _azure_batch(body)
    if body.get("object") == "list" and isinstance(body.get("data"), list):
        return {**body, "data": [_azure_batch(item) for item in body["data"]]}
    return body


def _azure_batch(batch: Any) -> Any:
    if isinstance(batch, dict) and isinstance(batch.get("endpoint"), str):
        return {**batch, "endpoint": batch["endpoint"].removeprefix("/v1")}
    return batch
