"""Credential patterns for what datafog-core does not find: (start, end) of each in a chunk of
prompts. Patterns that start with a literal are searched for directly, which is quick; those
that ignore case or start with an alternative cost a microsecond or more per prompt, so they
are searched only in a chunk that holds their needle (lower-cased), as few do."""

import bisect
import re
import unicodedata
from collections.abc import Iterator

# detect-secrets 1.5.0 (Apache-2.0), plugins/aws.py, openai.py, slack.py, private_key.py,
# github_token.py, jwt.py and basic_auth.py, copied: importing detect-secrets takes half a
# second and `requests` into every worker process of the shards step.
_AWS_ACCESS_KEY_ID = re.compile(r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}")
_OPENAI_LEGACY_KEY = re.compile(r"sk-[A-Za-z0-9-_]{0,80}[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}")
_GITHUB_TOKEN = re.compile(r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]*+(?:\.[A-Za-z0-9_-]*+(?:\.[A-Za-z0-9_.+/=-]*+)?)?")
"""Possessive: each match takes its whole run of token characters and is checked after (a
dot, 30 characters), so no run is scanned twice."""
_SLACK_TOKEN = re.compile(r"xox(?:a|b|p|o|s|r|e)-(?:\d{1,20}-){1,6}[a-z0-9]{1,64}", re.I)
_SLACK_WEBHOOK = re.compile(
    r"https://hooks\.slack\.com/services/T[a-zA-Z0-9_]{1,32}/B[a-zA-Z0-9_]{1,32}/[a-zA-Z0-9_]{1,64}",
    flags=re.IGNORECASE,
)
_ARMOR = re.compile(r"-----(BEGIN|END)([A-Z0-9 \r\n]{1,64}?)-----")
"""A PEM armor line, its label read with the line breaks a terminal put in it."""
_PUTTY = re.compile(r"PuTTY-User-Key-File-[23]")
# Basic auth in a URL (detect-secrets' BasicAuthDetector, here anchored on "://" so that it
# is searched for as a literal; the scheme in front is added to the finding). The password
# runs to the last "@" before the host: people paste passwords with an unencoded "@".
_URL_PASSWORD = re.compile(
    r"://[^\s:/?#@]{0,256}:[^\s/?#]{1,256}@[^\s/?#@]{1,256}(?:[/?#][^\s]{0,2048}+)?"
)
_URL_TAIL = ".,;:!?)]}>'\""
"""What ends a sentence after a URL rather than the URL."""
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*$")

# Tokens with a fixed prefix, after gitleaks' default rules (gitleaks.toml, the maintained
# set of vendor token formats); each starts with its literal prefix, which is searched for
# directly.
_PREFIXED = tuple(
    re.compile(pattern)
    for pattern in (
        # OpenAI project, service-account and admin keys; Anthropic keys
        r"sk-(?:proj|svcacct|admin|ant-[a-z]{1,12}\d{0,4})-[A-Za-z0-9_\-]{20,512}",
        r"AIza[0-9A-Za-z_\-]{35}",  # Google
        r"github_pat_[A-Za-z0-9_]{22,255}",  # GitHub fine-grained
        r"gl(?:pat|ptt|rt|dt|ft|soat|cbt|imt|agent|oas)-[0-9A-Za-z_\-]{20,64}",  # GitLab
        r"GR1348941[0-9A-Za-z_\-]{20}",  # GitLab runner registration
        r"sk_(?:live|test|prod)_[0-9A-Za-z]{10,99}",  # Stripe secret keys
        r"rk_(?:live|test|prod)_[0-9A-Za-z]{10,99}",  # Stripe restricted keys
        r"whsec_[0-9A-Za-z]{24,64}",  # Stripe webhook secret
        r"xapp-\d-[A-Z0-9]{1,16}-\d{1,16}-[a-z0-9]{32,80}",  # Slack app-level
        r"SG\.[0-9A-Za-z_\-]{20,24}\.[0-9A-Za-z_\-]{39,50}",  # SendGrid
        r"SK[0-9a-fA-F]{32}(?![0-9a-fA-F])",  # Twilio
        r"npm_[A-Za-z0-9]{36}",  # npm
        r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,1000}",  # PyPI
        r"hf_[A-Za-z]{34}",  # Hugging Face
        r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",  # Shopify
        r"do[opr]_v1_[a-f0-9]{64}",  # DigitalOcean
        r"ATATT3[A-Za-z0-9_\-=]{180,200}",  # Atlassian
        r"dapi[a-h0-9]{32}",  # Databricks
        r"dp\.(?:pt|st|sa|ct|scim|audit)\.[a-zA-Z0-9]{40,44}",  # Doppler
        r"hv[sb]\.[A-Za-z0-9_\-]{24,200}",  # HashiCorp Vault
        r"lin_api_[a-zA-Z0-9]{40}",  # Linear
        r"sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,43}",  # Square
        r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}",  # Postman
        r"NRAK-[A-Z0-9]{27}",  # New Relic
        r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",  # age
        r"sntry[su]_[A-Za-z0-9+/=_\-]{40,200}",  # Sentry
        r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}",  # Grafana service account
    )
)
_PASSWORD_NEEDLES = (
    "pass", "pwd", "kennwort", "contrase", "senha", "wachtwoord", "hasło", "haslo", "parola",
    "salasana", "senord", "パスワード", "密", "пароль", "पासवर्ड", "şifre", "sifre", "heslo",
    "jelszó", "parool", "adgangskode", "κωδικ", "סיסמ", "كلمة", "비밀번호", "mật khẩu",
)  # fmt: skip
"""What each password word holds (passwort, mot de passe: "pass"), looked for first."""
_PASSWORD_WORDS = (
    "password|passwd|passcode|passphrase|pwd|passwort|kennwort|mot de passe|contraseña|"
    "contrasena|senha|wachtwoord|hasło|haslo|parola|salasana|lösenord|losenord|passord|"
    "パスワード|密码|密碼|пароль|पासवर्ड|şifreniz|şifrem|şifre|sifrem|sifre|heslo|jelszó|parool|adgangskode|κωδικός|"
    "סיסמה|كلمة المرور|كلمة السر|비밀번호|mật khẩu"
)
PASSWORD_WORDS = sorted(_PASSWORD_WORDS.split("|"), key=len, reverse=True)
"""Longest first: "passwort" is tried before "pass…" words it is not."""
NOT_IN_A_VALUE = "\\s,;\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef「」『』"
"""What ends a password written out: a space, a comma, and in scripts without spaces the
next ideograph, kana, Hangul or CJK punctuation (初期パスワードは「h4EWEgo_2WD-G」です)."""
_PASSWORD_VALUE = re.compile(
    # A few words may stand between the word and its value ("the wifi password of the office
    # is", "mot de passe provisoire pour l'intranet :", "初期パスワードは"), up to a colon, an
    # equals sign or a verb that says what follows is the value.
    r"(?i:(?:[^\n:=：]{0,48}?(?:[:=：]|\s(?:is|was|ist|war|est|es|era|é|è|är|er|jest|je|"
    r"это|है|dır|dir)\s|は|是|为|為)|は|是|为|為|\s)?\s{0,4}[:=：]?\s{0,4}[「『\"'“‘]?)"
    rf"(?!@)(?=[^{NOT_IN_A_VALUE}]{{0,255}}[\d!@#$%^&*])([^{NOT_IN_A_VALUE}]{{6,256}})"
)
_PASSWORD = re.compile(rf"(?i:\b(?:{_PASSWORD_WORDS}))" + _PASSWORD_VALUE.pattern)
"""A password written out: a value with a digit or a symbol after the word (and an optional
"is"), so that "the new password is rejected" is not one. The value is the finding; the
word stays, so the model still reads that a password was there."""
_ASSIGNED = re.compile(
    r"[\w.\-]{0,24}[\"']?\s{0,4}[:=]\s{0,4}[\"']?([A-Za-z0-9_\-+/=.]{16,256})(?![A-Za-z0-9_\-+/=.])"
)
"""A value assigned to a name that says it is secret (SECRET_KEY_BASE: …, "api_key": "…",
auth-token=…), matched where the word ends; gitleaks' generic-api-key rule, bounded."""
_SECRET_NAMES = (
    "secret", "token", "api_key", "apikey", "api-key", "access_key", "auth_key", "privatekey",
    "private_key", "private-key", "signing_key",
)  # fmt: skip
_URL_PLACEHOLDERS = frozenset(
    {"password", "pass", "passwd", "pwd", "pw", "secret", "changeme", "yourpassword"}
)
_AWS_SECRET = re.compile(
    r"(?i:aws[\w.\-]{0,20}(?:secret|key)[\w.\-]{0,20}[\"']?\s{0,4}[:=]\s{0,4}[\"']?)"
    r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"
)

_FEWEST_DISTINCT = 12
"""A key with fewer distinct characters is a placeholder (glpat-xxxxxxxxxxxxxxxxxxxx,
sk_live_000000000000): a real one of 20 random characters has about 14."""

_DIRECT = (_AWS_ACCESS_KEY_ID, _OPENAI_LEGACY_KEY, _GITHUB_TOKEN, *_PREFIXED)
_TOKEN = re.compile(r"[A-Za-z0-9_\-.+/=]{20,}+")
"""A run of key characters long enough to hold a key: found in one pass over the chunk,
which costs what two or three literal searches do; the keys' own patterns then run on the
few runs a chunk of prose holds instead of on the whole chunk."""
_ANY_KEY = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in _DIRECT))
_NEEDLED = (
    ("xox", _SLACK_TOKEN),
    ("hooks.slack.com", _SLACK_WEBHOOK),
    ("aws", _AWS_SECRET),
)


def _passwords(joined: str, lowered: str) -> Iterator[tuple[int, int]]:
    """Each password written out after one of the words. The words are looked for in the
    lower-cased chunk as plain strings, which is many times quicker than a case-blind
    alternation over the whole chunk; the value is then matched where each word ends."""
    if len(lowered) != len(joined):  # lower() changed a length: offsets would not match
        for found in _PASSWORD.finditer(joined):
            yield found.span(1)
        return
    for needle in _PASSWORD_NEEDLES:
        if needle not in lowered:
            continue
        words = [(word, word.index(needle)) for word in PASSWORD_WORDS if needle in word]
        at = lowered.find(needle)
        while at >= 0:
            # The next digit or symbol: a word further than a value's reach before it has no
            # value, and neither has any word up to there (a long run of "password" is
            # passed over in one step, not a regex run per word).
            value_char = _VALUE_CHAR.search(joined, at)
            if value_char is None:
                break
            if value_char.start() - at > _VALUE_REACH:
                at = lowered.find(needle, value_char.start() - _VALUE_REACH)
                continue
            for word, offset in words:
                start = at - offset
                # "pwd" must start a word; the others also end compounds (Einmalpasswort,
                # mypassword=) and scripts without spaces have no boundaries.
                if start < 0 or not lowered.startswith(word, start):
                    continue
                if word == "pwd" and start and lowered[start - 1].isalnum():
                    continue
                match = _PASSWORD_VALUE.match(joined, start + len(word))
                if match and _a_value(match.group(1)):
                    yield match.start(1), match.start(1) + len(_trimmed(match.group(1)))
                break
            at = lowered.find(needle, at + len(needle))


_VALUE_CHAR = re.compile(r"[\d!@#$%^&*]")
_DIGIT = re.compile(r"\d")
_VALUE_REACH = 340
"""How far after a password word its value's digit or symbol can be: the longest word, the
words between (48), spaces and a quote, and the value's own 256 characters."""
_AN_ADDRESS = re.compile(r"[^@\s]{1,64}@[^@\s]{1,255}\.[A-Za-z]{2,24}")
_TRAILING = ".,;:!?)]}>'\"。、）"


def _trimmed(value: str) -> str:
    """A value without the sentence's punctuation after it."""
    return value.rstrip(_TRAILING)


def _a_value(value: str) -> bool:
    """Whether what follows a password word or a secret's name is a value, not a placeholder
    (${DB_PASSWORD}, !vault, ********, <password>), a code (PWD-0042) or the rest of a
    sentence in a script without spaces: it has a letter and a digit or symbol, starts with
    neither punctuation nor a sigil, holds no ideographs and is not an e-mail address."""
    value = _trimmed(value)
    if len(value) < 6 or value[0] in "$!<{[%*(-":
        return False
    if not any(c.isalpha() for c in value) or set(value) <= set("*x•#"):
        return False
    if _AN_ADDRESS.fullmatch(value):  # "password reset mails go to: ana@example.org"
        return False
    return not any(unicodedata.category(c) in ("Lo", "Po") and not c.isascii() for c in value)


def _assigned(joined: str, lowered: str) -> Iterator[tuple[int, int]]:
    """Each value assigned to a secret's name, when it looks like a key: letters and digits,
    at least ten distinct characters (a sentence or a placeholder has neither)."""
    if len(lowered) != len(joined):
        return
    for name in _SECRET_NAMES:
        at = lowered.find(name)
        while at >= 0:
            digit = _DIGIT.search(joined, at)  # a key has one; see _passwords
            if digit is None:
                break
            if digit.start() - at > _VALUE_REACH:
                at = lowered.find(name, digit.start() - _VALUE_REACH)
                continue
            match = _ASSIGNED.match(joined, at + len(name))
            public = "public" in lowered[max(0, at - 12) : at]  # PublicKeyToken: an id
            if match and not public:
                value = match.group(1)
                letters_and_digits = any(c.isdigit() for c in value) and any(
                    c.isalpha() for c in value
                )
                if letters_and_digits and len(set(value)) >= 10 and _a_value(value):
                    yield match.span(1)
            at = lowered.find(name, at + len(name))


def _placeholder_url(match: re.Match[str]) -> bool:
    """postgres://USER:PASSWORD@HOST/DB in a how-to: the password is a word for one."""
    user_info = match.group()[3:].rsplit("@", 1)[0]
    password = user_info.partition(":")[2].strip("<>{}$[]")
    return password.lower() in _URL_PLACEHOLDERS or set(password) <= set("x*.")


def _private_keys(text: str) -> Iterator[tuple[int, int]]:
    """Each private key block: from its BEGIN line to its END line (or the end of the text),
    so a redaction takes the key, not just its header. An armor line is read with its line
    breaks and spaces taken out: a narrow terminal wraps "-----BEGIN OPENSSH PRIVATE KEY-----"
    anywhere, even inside a word."""
    begins: list[re.Match[str]] = []
    ends: list[re.Match[str]] = []
    for match in _ARMOR.finditer(text):
        if "PRIVATEKEY" in re.sub(r"\s", "", match.group(2)):
            (begins if match.group(1) == "BEGIN" else ends).append(match)
    end_at = [m.end() for m in ends]
    for match in begins:
        after = bisect.bisect_left(end_at, match.end())
        yield match.start(), end_at[after] if after < len(end_at) else len(text)
    for match in _PUTTY.finditer(text):
        yield match.start(), len(text)


_AUTHORIZATION = re.compile(
    r"[:\s]{1,4}(?i:bearer|basic|token)\s{1,4}([A-Za-z0-9\-._~+/]{12,2048}=*)"
)
"""The credentials of an Authorization header, wherever the header is written."""
_MYSQL_PASSWORD = re.compile(r"[^\n]{0,120}?\s-p([^\s'\"]{4,128})")
"""mysql -u root -pSecret: the password glued to -p on a client's command line."""


def _headers_and_commands(joined: str, lowered: str) -> Iterator[tuple[int, int]]:
    """Credentials after "Authorization", and a password glued to -p after mysql."""
    for word, pattern in (("authorization", _AUTHORIZATION), ("mysql", _MYSQL_PASSWORD)):
        at = lowered.find(word)
        while at >= 0:
            match = pattern.match(joined, at + len(word))
            if match and len(set(match.group(1))) >= 8:
                yield match.span(1)
            at = lowered.find(word, at + len(word))


def credentials(joined: str, lowered: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each credential found in `joined` (`lowered` is it in lower case)."""
    for token in _TOKEN.finditer(joined):
        for match in _ANY_KEY.finditer(joined, token.start(), token.end()):
            if len(set(match.group())) >= _FEWEST_DISTINCT:
                yield match.start(), match.end()
    for match in _JWT.finditer(joined):
        if match.end() - match.start() >= 30 and "." in match.group():
            yield match.start(), match.end()
    searched = set()
    for needle, pattern in _NEEDLED:
        if pattern in searched or needle not in lowered:
            continue
        searched.add(pattern)
        for match in pattern.finditer(joined):
            yield match.span(match.lastindex or 0)
    yield from _passwords(joined, lowered)
    yield from _assigned(joined, lowered)
    yield from _headers_and_commands(joined, lowered)
    if "-----begin" in lowered or "putty-user-key" in lowered:
        yield from _private_keys(joined)
    for match in _URL_PASSWORD.finditer(joined):
        if _placeholder_url(match):
            continue
        scheme = _SCHEME.search(joined, max(0, match.start() - 20), match.start())
        end = match.start() + len(match.group().rstrip(_URL_TAIL))
        yield scheme.start() if scheme else match.start(), end
