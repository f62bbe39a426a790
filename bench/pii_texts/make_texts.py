#!/usr/bin/env python3
"""Generate labelled test texts for the personal-data detectors.

Writes development.jsonl and heldout.jsonl next to this script.  The
sentence templates are hand-written; this script only fills in values
whose check digits must be computed (Luhn, IBAN mod-97, JWT base64) and
random-looking identifiers.  Every sentence template list is split into a
development part and a held-out part, so the two files share no template.

Run:  python make_texts.py            (writes the files)
      python make_texts.py --check    (also validates with python-stdnum /
                                       phonenumbers if they are installed)
"""
import base64
import json
import os
import random
import re
import string
import sys
import unicodedata
import uuid

SEED = 20261105
HERE = os.path.dirname(os.path.abspath(__file__))

NBSP = "\u00a0"
THIN = "\u2009"
NNBSP = "\u202f"
ZWSP = "\u200b"
SHY = "\u00ad"
LRM = "\u200e"
RLM = "\u200f"

ENTITY = {"email": "email", "phone": "phone", "card": "card", "iban": "iban",
          "ssn": "national_id", "ip": "ip_address", "cred": "credential"}
TYPES = list(ENTITY.values())

FW_TABLE = {ord(c): chr(ord(c) + 0xFEE0) for c in string.digits + string.ascii_letters}
FW_TABLE[ord(" ")] = "\u3000"
FW_TABLE[ord("-")] = "\uff0d"


def fullwidth(s, keep_space=False):
    t = dict(FW_TABLE)
    if keep_space:
        del t[ord(" ")]
    return s.translate(t)


def digits(rng, n):
    return "".join(rng.choice(string.digits) for _ in range(n))


def nzdigits(rng, n):
    return rng.choice("123456789") + digits(rng, n - 1)


def rstr(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"


# ----------------------------------------------------------------- Luhn / cards

def luhn_ok(num):
    total = 0
    for i, ch in enumerate(reversed(num)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def luhn_complete(partial):
    for c in string.digits:
        if luhn_ok(partial + c):
            return partial + c
    raise AssertionError


def card_number(rng, brand):
    if brand == "visa":
        return luhn_complete("4" + digits(rng, 14))
    if brand == "mc":
        return luhn_complete("5" + rng.choice("12345") + digits(rng, 13))
    if brand == "mc2":
        return luhn_complete(str(rng.randint(2221, 2720)) + digits(rng, 11))
    if brand == "amex":
        return luhn_complete(rng.choice(["34", "37"]) + digits(rng, 12))
    if brand == "disc":
        p = rng.choice(["6011", "65" + digits(rng, 2), "6445", "6011"])
        return luhn_complete(p + digits(rng, 15 - len(p)))
    if brand == "jcb":
        return luhn_complete(str(rng.randint(3528, 3589)) + digits(rng, 11))
    if brand == "diners":
        p = rng.choice(["36", "38", "30" + rng.choice("012345")])
        return luhn_complete(p + digits(rng, 13 - len(p)))
    raise KeyError(brand)


def card_groups(num):
    if len(num) == 15:
        return [num[:4], num[4:10], num[10:]]
    if len(num) == 14:
        return [num[:4], num[4:10], num[10:]]
    return [num[i:i + 4] for i in range(0, len(num), 4)]


CARD_BRANDS = [("visa", 34), ("mc", 18), ("mc2", 7), ("amex", 12), ("disc", 8),
               ("jcb", 8), ("diners", 5)]
CARD_STYLES = [("space", 30), ("dash", 16), ("plain", 14), ("dot", 5), ("nbsp", 7),
               ("thin", 6), ("zwsp", 6), ("fw", 5), ("nnbsp", 3), ("shy", 3), ("mixed", 3),
               ("fwsp", 2)]


def wchoice(rng, pairs):
    tot = sum(w for _, w in pairs)
    x = rng.uniform(0, tot)
    for v, w in pairs:
        x -= w
        if x <= 0:
            return v
    return pairs[-1][0]


def gen_card(rng, mods, lang):
    brand = next((m for m in mods if m in dict(CARD_BRANDS)), None) or wchoice(rng, CARD_BRANDS)
    style = next((m for m in mods if m in dict(CARD_STYLES)), None)
    if style is None:
        style = wchoice(rng, CARD_STYLES)
        if lang in ("ja", "zh") and rng.random() < 0.35:
            style = rng.choice(["fw", "fwsp"])
    num = card_number(rng, brand)
    g = card_groups(num)
    if style == "space":
        return " ".join(g)
    if style == "dash":
        return "-".join(g)
    if style == "plain":
        return num
    if style == "dot":
        return ".".join(g)
    if style == "nbsp":
        return NBSP.join(g)
    if style == "nnbsp":
        return NNBSP.join(g)
    if style == "thin":
        return THIN.join(g)
    if style == "zwsp":
        return ZWSP.join(g)
    if style == "fw":
        return fullwidth(" ".join(g))
    if style == "fwsp":
        return fullwidth(" ".join(g), keep_space=True)
    if style == "shy":
        return " ".join(g[:2]) + " " + g[2][:2] + SHY + g[2][2:] + (" " + " ".join(g[3:]) if g[3:] else "")
    if style == "mixed":
        return g[0] + " " + "-".join(g[1:])
    raise KeyError(style)


# ----------------------------------------------------------------- IBAN

def iban_checkdigits(cc, bban):
    s = bban + cc + "00"
    num = "".join(str(int(ch, 36)) for ch in s)
    return "%02d" % (98 - int(num) % 97)


def es_ccc(rng):
    w = [1, 2, 4, 8, 5, 10, 9, 7, 3, 6]

    def dig(s):
        r = 11 - sum(int(a) * b for a, b in zip(s, w)) % 11
        return {11: 0, 10: 1}.get(r, r)
    bank, branch, acct = digits(rng, 4), digits(rng, 4), digits(rng, 10)
    return bank + branch + str(dig("00" + bank + branch)) + str(dig(acct)) + acct


def fr_rib(rng):
    bank, branch, acct = nzdigits(rng, 5), digits(rng, 5), digits(rng, 11)
    key = 97 - (89 * int(bank) + 15 * int(branch) + 3 * int(acct)) % 97
    return bank + branch + acct + "%02d" % key


IT_ODD = [1, 0, 5, 7, 9, 13, 15, 17, 19, 21]


def it_bban(rng):
    abi, cab, conto = digits(rng, 5), digits(rng, 5), digits(rng, 12)
    s = abi + cab + conto
    tot = sum(IT_ODD[int(c)] if i % 2 == 0 else int(c) for i, c in enumerate(s))
    return chr(ord("A") + tot % 26) + s


def be_bban(rng):
    bank = rng.choice(["001", "050", "068", "096", "103", "143", "210", "290", "310", "320", "340", "363",
                       "550", "645", "651", "732", "734", "735", "737", "750", "780", "850", "973", "979"])
    first = bank + digits(rng, 7)
    chk = int(first) % 97 or 97
    return first + "%02d" % chk


def no_bban(rng):
    w = [5, 4, 3, 2, 7, 6, 5, 4, 3, 2]
    while True:
        first = nzdigits(rng, 10)
        r = 11 - sum(int(a) * b for a, b in zip(first, w)) % 11
        if r == 11:
            r = 0
        if r != 10:
            return first + str(r)


def pt_bban(rng):
    first = digits(rng, 19)
    return first + "%02d" % (98 - (int(first) * 100) % 97)


IBAN_SPECS = {
    "de": lambda r: nzdigits(r, 8) + digits(r, 10),
    "at": lambda r: nzdigits(r, 5) + digits(r, 11),
    "ch": lambda r: "00" + digits(r, 3) + digits(r, 12),
    "li": lambda r: "08" + digits(r, 3) + digits(r, 12),
    "fr": fr_rib,
    "es": es_ccc,
    "it": it_bban,
    "sm": it_bban,
    "nl": lambda r: r.choice(["ABNA", "INGB", "RABO", "TRIO", "KNAB", "SNSB", "ASNB"]) + digits(r, 10),
    "be": be_bban,
    "lu": lambda r: digits(r, 3) + digits(r, 13),
    "gb": lambda r: r.choice(["NWBK", "BARC", "LOYD", "HBUK", "MIDL", "MONZ", "REVO"]) + digits(r, 14),
    "ie": lambda r: r.choice(["AIBK", "BOFI", "IPBS"]) + digits(r, 14),
    "pl": lambda r: digits(r, 24),
    "pt": pt_bban,
    "se": lambda r: digits(r, 20),
    "no": no_bban,
    "dk": lambda r: digits(r, 14),
    "fi": lambda r: digits(r, 14),
    "cz": lambda r: digits(r, 20),
    "sk": lambda r: digits(r, 20),
    "hu": lambda r: digits(r, 24),
    "ro": lambda r: r.choice(["BTRL", "RNCB", "BRDE", "INGB"]) + digits(r, 16),
    "gr": lambda r: digits(r, 23),
    "tr": lambda r: digits(r, 5) + "0" + digits(r, 16),
    "sa": lambda r: digits(r, 2) + digits(r, 18),
    "ae": lambda r: digits(r, 3) + digits(r, 16),
    "hr": lambda r: digits(r, 17),
    "si": lambda r: digits(r, 15),
    "ee": lambda r: digits(r, 16),
    "lt": lambda r: digits(r, 16),
    "lv": lambda r: r.choice(["HABA", "UNLA", "PARX"]) + digits(r, 13),
    "mt": lambda r: r.choice(["MALT", "VALL"]) + digits(r, 5) + digits(r, 18),
    "il": lambda r: digits(r, 19),
    "br": lambda r: digits(r, 8) + digits(r, 5) + digits(r, 10) + "C1",
    "il_": None,
}
del IBAN_SPECS["il_"]

LANG_IBAN = {
    "en": ["gb", "gb", "ie", "de", "fr", "nl", "es", "it", "be", "lu", "ch", "mt"],
    "de": ["de", "de", "de", "at", "ch", "li", "lu"],
    "fr": ["fr", "fr", "be", "lu", "ch"],
    "es": ["es", "es", "es", "pt"],
    "it": ["it", "it", "sm", "ch"],
    "nl": ["nl", "nl", "be"],
    "pl": ["pl", "pl", "de"],
    "pt": ["pt", "pt", "br", "es"],
    "ja": ["de", "gb", "fr"],
    "zh": ["de", "gb", "hr", "fr"],
    "ru": ["de", "ee", "lv", "lt", "cz"],
    "ar": ["sa", "ae", "sa", "ae"],
    "hi": ["gb", "ae", "de"],
    "tr": ["tr", "tr", "de"],
    "he": ["il", "il"],
    "sv": ["se"], "da": ["dk"], "fi": ["fi"], "cs": ["cz"],
}


def gen_iban(rng, mods, lang):
    cc = next((m for m in mods if m in IBAN_SPECS), None) or rng.choice(LANG_IBAN.get(lang, ["de", "gb", "fr"]))
    bban = IBAN_SPECS[cc](rng)
    CC = cc.upper()
    iban = CC + iban_checkdigits(CC, bban) + bban
    style = next((m for m in mods if m in ("group", "compact", "lower", "lowergroup", "dash",
                                          "nbsp", "shy", "thin")), None)
    if style is None:
        style = wchoice(rng, [("group", 50), ("compact", 18), ("lower", 4), ("lowergroup", 5),
                              ("dash", 6), ("nbsp", 8), ("shy", 3), ("thin", 3)])
    g = [iban[i:i + 4] for i in range(0, len(iban), 4)]
    if style == "group":
        return " ".join(g)
    if style == "compact":
        return iban
    if style == "lower":
        return iban.lower()
    if style == "lowergroup":
        return " ".join(g).lower()
    if style == "dash":
        return "-".join(g)
    if style == "nbsp":
        return NBSP.join(g)
    if style == "thin":
        return THIN.join(g)
    if style == "shy":
        k = len(g) // 2
        return " ".join(g[:k]) + " " + g[k][:2] + SHY + g[k][2:] + " " + " ".join(g[k + 1:])
    raise KeyError(style)


# ----------------------------------------------------------------- SSN

UDASHES = ["\u2011", "\u2010", "\u2013", "\u2212", "\u2012", "\ufe63", "\uff0d"]


def ssn_digits(rng):
    while True:
        area = rng.randint(1, 899)
        if area == 666:
            continue
        grp = rng.randint(1, 99)
        ser = rng.randint(1, 9999)
        s = "%03d%02d%04d" % (area, grp, ser)
        if s in ("078051120", "219099999", "123456789"):
            continue
        return s


def gen_ssn(rng, mods, lang):
    s = ssn_digits(rng)
    a, b, c = s[:3], s[3:5], s[5:]
    style = next((m for m in mods if m in ("dash", "space", "plain", "udash", "nbsp", "fw")), None)
    if style is None:
        style = wchoice(rng, [("dash", 55), ("space", 13), ("plain", 9), ("udash", 14),
                              ("nbsp", 4), ("fw", 3)])
    if style == "dash":
        return f"{a}-{b}-{c}"
    if style == "space":
        return f"{a} {b} {c}"
    if style == "plain":
        return s
    if style == "udash":
        d = rng.choice(UDASHES)
        return f"{a}{d}{b}{d}{c}"
    if style == "nbsp":
        return f"{a}{NBSP}{b}{NBSP}{c}"
    if style == "fw":
        return fullwidth(f"{a}-{b}-{c}")
    raise KeyError(style)


# ----------------------------------------------------------------- IP addresses

PUB_FIRST = [23, 31, 37, 46, 62, 77, 78, 81, 82, 85, 89, 91, 93, 94, 104, 109, 128, 141,
             145, 151, 176, 178, 185, 188, 193, 194, 195, 203, 212, 213, 217, 5, 45, 66, 71, 98]


def ipv4_public(rng):
    return "%d.%d.%d.%d" % (rng.choice(PUB_FIRST), rng.randint(0, 255), rng.randint(0, 255),
                            rng.randint(1, 254))


def ipv4_private(rng):
    k = rng.randint(0, 2)
    if k == 0:
        return "10.%d.%d.%d" % (rng.randint(0, 255), rng.randint(0, 255), rng.randint(2, 254))
    if k == 1:
        return "172.%d.%d.%d" % (rng.randint(16, 31), rng.randint(0, 255), rng.randint(2, 254))
    return "192.168.%d.%d" % (rng.randint(0, 255), rng.randint(2, 254))


def ipv4_doc(rng):
    return rng.choice(["192.0.2.", "198.51.100.", "203.0.113."]) + str(rng.randint(1, 254))


def h16(rng, lead=False):
    v = rng.randint(0, 0xFFFF)
    return "%x" % v


def ipv6(rng, kind):
    if kind == "v6full":
        groups = ["2001", "0db8"] + ["%04x" % rng.randint(0, 0xFFFF) for _ in range(6)]
        return ":".join(groups)
    if kind == "v6ll":
        return "fe80::%x:%x:%x:%x" % tuple(rng.randint(1, 0xFFFF) for _ in range(4))
    if kind == "v6ula":
        return "fd%02x:%x:%x:%x::%x" % (rng.randint(0, 255), rng.randint(1, 0xFFFF),
                                         rng.randint(1, 0xFFFF), rng.randint(1, 0xFFFF),
                                         rng.randint(1, 0xFFFF))
    if kind == "v6mapped":
        return "::ffff:" + ipv4_public(rng)
    if kind == "v6upper":
        return ("2001:DB8:%X:%X::%X" % (rng.randint(1, 0xFFFF), rng.randint(1, 0xFFFF),
                                         rng.randint(1, 0xFFFF)))
    # global unicast, compressed
    prefix = rng.choice(["2001:db8", "2a02:8108", "2a01:4f8", "2600:1f18", "2001:4860",
                         "2a00:1450", "2c0f:fb50", "2406:da18", "2001:db8"])
    tail = [h16(rng) for _ in range(rng.randint(1, 4))]
    mid = [h16(rng) for _ in range(rng.randint(0, 2))]
    if len(mid) + len(tail) + 2 >= 8:
        return prefix + ":" + ":".join(mid + tail)
    return prefix + ":" + (":".join(mid) + ":" if mid else "") + ":" + ":".join(tail)


def gen_ip(rng, mods, lang):
    kind = next((m for m in mods if m in ("v4", "v4priv", "v4doc", "v6", "v6full", "v6ll",
                                         "v6ula", "v6mapped", "v6upper")), None)
    if kind is None:
        kind = wchoice(rng, [("v4", 34), ("v4priv", 18), ("v4doc", 14), ("v6", 16),
                             ("v6full", 5), ("v6ll", 4), ("v6ula", 3), ("v6mapped", 3),
                             ("v6upper", 3)])
    if kind == "v4":
        return ipv4_public(rng)
    if kind == "v4priv":
        return ipv4_private(rng)
    if kind == "v4doc":
        return ipv4_doc(rng)
    return ipv6(rng, kind)


# ----------------------------------------------------------------- phones
# Each function returns (text, ISO region).  Formats follow how numbers are
# printed in that country; subscriber digits are random.

def _pairs(s):
    return " ".join(s[i:i + 2] for i in range(0, len(s), 2))


def ph_us(rng, region="US", areas=None):
    areas = areas or [212, 646, 718, 415, 628, 312, 773, 617, 857, 206, 303, 404, 512, 713,
                      305, 702, 602, 503, 202, 215, 984, 919, 614, 313, 651, 801]
    a = rng.choice(areas)
    while True:
        e = rng.choice("23456789") + digits(rng, 2)
        if e[1:] != "11" and e != "555":
            break
    s = digits(rng, 4)
    f = rng.choice([f"({a}) {e}-{s}", f"{a}-{e}-{s}", f"{a}.{e}.{s}", f"+1 {a} {e} {s}",
                    f"+1 ({a}) {e}-{s}", f"1-{a}-{e}-{s}", f"+1-{a}-{e}-{s}", f"{a} {e} {s}",
                    f"({a}) {e}-{s}", f"{a}-{e}-{s}", f"+1 {a}-{e}-{s}", f"{a}{e}{s}"])
    return f, region


def ph_ca(rng):
    return ph_us(rng, "CA", [416, 647, 437, 604, 778, 514, 438, 403, 587, 613, 905, 902, 780])


def ph_uk(rng, mob=None):
    if mob is None:
        mob = rng.random() < 0.45
    if mob:
        p = rng.choice(["7400", "7411", "7440", "7507", "7538", "7711", "7723", "7745", "7766",
                        "7807", "7817", "7854", "7870", "7888", "7901", "7920", "7944", "7956",
                        "7967", "7973", "7985", "7412", "7588", "7799"])
        s = digits(rng, 6)
        f = rng.choice([f"0{p} {s}", f"0{p} {s[:3]} {s[3:]}", f"+44 {p} {s}", f"+44 (0){p} {s}",
                        f"+44 {p} {s[:3]} {s[3:]}", f"0{p}-{s[:3]}-{s[3:]}", f"0{p}{s}"])
        return f, "GB"
    k = rng.random()
    if k < 0.55:
        s = rng.choice("378") + digits(rng, 7)
        f = rng.choice([f"020 {s[:4]} {s[4:]}", f"+44 20 {s[:4]} {s[4:]}",
                        f"+44 (0) 20 {s[:4]} {s[4:]}", f"+44 (0)20 {s[:4]} {s[4:]}",
                        f"(020) {s[:4]} {s[4:]}", f"0044 20 {s[:4]} {s[4:]}", f"020{s}"])
        return f, "GB"
    firsts = {"121": "234567", "161": "2345678", "131": "2345678", "141": "2345678", "151": "2345678",
              "113": "2345", "114": "2345", "117": "234", "118": "234", "115": "2"}
    a = rng.choice(sorted(firsts))
    s = rng.choice(firsts[a]) + digits(rng, 6)
    f = rng.choice([f"0{a} {s[:3]} {s[3:]}", f"+44 {a} {s[:3]} {s[3:]}", f"(0{a}) {s[:3]} {s[3:]}",
                    f"+44 (0){a} {s[:3]} {s[3:]}"])
    return f, "GB"


def ph_de(rng, mob=None):
    if mob is None:
        mob = rng.random() < 0.4
    if mob:
        p, n = rng.choice([("151", 8), ("152", 8), ("157", 8), ("160", 7), ("170", 7), ("171", 7),
                           ("172", 7), ("175", 7), ("176", 8), ("177", 8), ("178", 8), ("179", 7),
                           ("159", 8), ("162", 7)])
        s = nzdigits(rng, n)
        f = rng.choice([f"0{p} {s}", f"0{p}-{s}", f"0{p}/{s}", f"+49 {p} {s}", f"+49 (0){p} {s}",
                        f"+49 (0) {p} {s}", f"0{p} {s[:3]} {s[3:]}", f"+49{p}{s}",
                        f"0049 {p} {s}"])
        return f, "DE"
    a, n = rng.choice([("30", 8), ("30", 7), ("89", 7), ("89", 8), ("40", 7), ("40", 8),
                       ("69", 7), ("69", 8), ("221", 7), ("211", 7), ("711", 7), ("341", 7),
                       ("351", 7), ("511", 7), ("911", 7), ("421", 7), ("201", 7), ("621", 7)])
    s = rng.choice("2345679") + digits(rng, n - 1)
    g = " ".join(s[i:i + 2] for i in range(0, len(s), 2))
    f = rng.choice([f"0{a} {s}", f"0{a}/{s}", f"0{a}-{s}", f"+49 {a} {s}", f"+49 (0){a} {s}",
                    f"+49 (0) {a} {s}", f"0049 {a} {s}", f"(0{a}) {s}", f"0{a} / {g}",
                    f"+49 {a} {s[:3]} {s[3:]}", f"0{a} {s[:3]} {s[3:]}"])
    return f, "DE"


def ph_at(rng):
    if rng.random() < 0.5:
        p, n = rng.choice([("664", 7), ("676", 7), ("699", 8), ("650", 7), ("660", 7), ("681", 8)])
        s = nzdigits(rng, n)
        f = rng.choice([f"0{p} {s}", f"+43 {p} {s}", f"+43 (0){p} {s[:3]} {s[3:]}", f"0{p}/{s}"])
        return f, "AT"
    s = rng.choice("2345679") + digits(rng, 6)
    f = rng.choice([f"+43 1 {s}", f"01 {s[:3]} {s[3:5]} {s[5:]}", f"+43 (0)1 {s}", f"01/{s}"])
    return f, "AT"


def ph_ch(rng):
    a = rng.choice(["44", "43", "31", "22", "61", "21", "41", "71", "76", "77", "78", "79", "79"])
    s = rng.choice("2345678") + digits(rng, 6)
    f = rng.choice([f"0{a} {s[:3]} {s[3:5]} {s[5:]}", f"+41 {a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"+41 (0){a} {s[:3]} {s[3:5]} {s[5:]}", f"0041 {a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"0{a}{s}"])
    return f, "CH"


def ph_fr(rng):
    first = rng.choice("1234566779")
    if first == "7":
        n = "7" + rng.choice("3456789") + digits(rng, 7)
    else:
        # avoid overseas-department ranges (0590-0596, 0690-0696, 0639, 0262/0269)
        second = rng.choice({"2": "1234578", "6": "0124578"}.get(first, "12345678"))
        n = first + second + digits(rng, 7)
    p = _pairs(n[1:])
    f = rng.choice([f"0{n[0]} {p}", f"0{n[0]} {p}", f"+33 {n[0]} {p}", f"+33 (0){n[0]} {p}",
                    "0" + n[0] + "." + p.replace(" ", "."), "0" + n[0] + "-" + p.replace(" ", "-"),
                    f"0{n}", f"+33{n}", f"0033 {n[0]} {p}"])
    return f, "FR"


def ph_be(rng):
    if rng.random() < 0.5:
        n = "4" + rng.choice("6789") + digits(rng, 7)
        f = rng.choice([f"0{n[:3]} {n[3:5]} {n[5:7]} {n[7:]}", f"+32 {n[:3]} {n[3:5]} {n[5:7]} {n[7:]}",
                        f"0{n[:3]}/{n[3:5]}.{n[5:7]}.{n[7:]}"])
        return f, "BE"
    a = rng.choice("2349")
    s = rng.choice({"4": "23", "9": "234"}.get(a, "2345")) + digits(rng, 6)
    f = rng.choice([f"0{a} {s[:3]} {s[3:5]} {s[5:]}", f"+32 {a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"0{a}/{s[:3]}.{s[3:5]}.{s[5:]}"])
    return f, "BE"


def ph_es(rng):
    if rng.random() < 0.55:
        n = "6" + digits(rng, 8)
    else:
        n = rng.choice(["91", "93", "96", "95", "94", "98", "97"]) + rng.choice("2345") + digits(rng, 6)
    f = rng.choice([f"{n[:3]} {n[3:5]} {n[5:7]} {n[7:]}", f"{n[:3]} {n[3:6]} {n[6:]}", n,
                    f"+34 {n[:3]} {n[3:6]} {n[6:]}", f"+34 {n}", f"0034 {n[:3]} {n[3:5]} {n[5:7]} {n[7:]}",
                    f"+34 {n[:2]} {n[2:5]} {n[5:7]} {n[7:]}" if n[0] == "9" else f"+34-{n[:3]}-{n[3:6]}-{n[6:]}"])
    return f, "ES"


def ph_mx(rng):
    a = rng.choice(["55", "33", "81"])
    s = rng.choice("2345689") + digits(rng, 7)
    f = rng.choice([f"+52 {a} {s[:4]} {s[4:]}", f"{a} {s[:4]} {s[4:]}", f"({a}) {s[:4]}-{s[4:]}",
                    f"+52 ({a}) {s[:4]} {s[4:]}"])
    return f, "MX"


def ph_it(rng):
    k = rng.random()
    if k < 0.55:
        p = rng.choice(["320", "324", "327", "328", "329", "330", "331", "333", "334", "335", "338",
                        "339", "340", "342", "345", "346", "347", "348", "349", "351", "366",
                        "368", "380", "388", "389", "392", "393"])
        s = digits(rng, 7)
        f = rng.choice([f"{p} {s[:3]} {s[3:]}", f"{p} {s}", f"{p}-{s}", f"+39 {p} {s[:3]} {s[3:]}",
                        f"+39 {p}{s}", f"0039 {p} {s}", f"+39 {p} {s}"])
        return f, "IT"
    a, n = rng.choice([("06", 8), ("02", 8), ("081", 7), ("011", 7), ("055", 7), ("051", 7),
                       ("041", 7), ("010", 7)])
    s = rng.choice("23456789") + digits(rng, n - 1)
    f = rng.choice([f"{a} {s[:4]} {s[4:]}", f"{a} {s}", f"+39 {a} {s[:4]} {s[4:]}",
                    f"+39 {a} {s}", f"{a}-{s}", f"{a}/{s}"])
    return f, "IT"


def ph_nl(rng):
    if rng.random() < 0.55:
        s = rng.choice("12345") + digits(rng, 7)
        f = rng.choice([f"06-{s}", f"06 {s}", f"06 {s[:4]} {s[4:]}", f"+31 6 {s}", f"+31 (0)6 {s}",
                        f"0031 6 {s[:4]} {s[4:]}", f"+316{s}", f"06-{s[:2]} {s[2:4]} {s[4:6]} {s[6:]}"])
        return f, "NL"
    a = rng.choice(["20", "10", "70", "30", "40", "50", "23", "24", "13", "15"])
    s = rng.choice("2345678") + digits(rng, 6)
    f = rng.choice([f"0{a}-{s[:3]} {s[3:]}", f"0{a} {s[:3]} {s[3:]}", f"+31 {a} {s[:3]} {s[3:]}",
                    f"(0{a}) {s[:3]} {s[3:5]} {s[5:]}", f"0{a}-{s}", f"+31 (0){a} {s[:3]} {s[3:]}"])
    return f, "NL"


def ph_pl(rng):
    if rng.random() < 0.6:
        n = rng.choice(["50", "51", "53", "57", "60", "66", "69", "72", "73", "78", "79", "88"]) + digits(rng, 7)
        f = rng.choice([f"{n[:3]} {n[3:6]} {n[6:]}", f"+48 {n[:3]} {n[3:6]} {n[6:]}",
                        f"+48 {n[:3]}-{n[3:6]}-{n[6:]}", n, f"+48{n}", f"{n[:3]}-{n[3:6]}-{n[6:]}"])
        return f, "PL"
    a = rng.choice(["22", "12", "71", "58", "61", "42", "32"])
    s = rng.choice("2345678") + digits(rng, 6)
    f = rng.choice([f"{a} {s[:3]} {s[3:5]} {s[5:]}", f"+48 {a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"({a}) {s[:3]}-{s[3:5]}-{s[5:]}"])
    return f, "PL"


def ph_pt(rng):
    if rng.random() < 0.6:
        n = "9" + rng.choice("1236") + digits(rng, 7)
    else:
        n = rng.choice(["21", "22"]) + rng.choice("2345") + digits(rng, 6)
    f = rng.choice([f"{n[:3]} {n[3:6]} {n[6:]}", f"+351 {n[:3]} {n[3:6]} {n[6:]}", f"+351 {n}",
                    f"{n[:2]} {n[2:5]} {n[5:]}" if n[0] == "2" else f"{n[:3]} {n[3:]}"])
    return f, "PT"


def ph_br(rng):
    ddd = rng.choice(["11", "21", "31", "41", "51", "61", "71", "81", "19", "48"])
    if rng.random() < 0.6:
        s = "9" + rng.choice("6789") + digits(rng, 7)
        f = rng.choice([f"+55 {ddd} {s[:5]}-{s[5:]}", f"({ddd}) {s[:5]}-{s[5:]}", f"{ddd} {s[:5]} {s[5:]}",
                        f"+55 ({ddd}) {s[:5]}-{s[5:]}"])
    else:
        s = rng.choice("2345") + digits(rng, 7)
        f = rng.choice([f"({ddd}) {s[:4]}-{s[4:]}", f"+55 {ddd} {s[:4]}-{s[4:]}"])
    return f, "BR"


def ph_jp(rng):
    k = rng.random()
    if k < 0.45:
        p = rng.choice(["90", "80", "70"])
        s = rng.choice("123456789") + digits(rng, 7)
        f = rng.choice([f"0{p}-{s[:4]}-{s[4:]}", f"+81 {p}-{s[:4]}-{s[4:]}", f"+81 {p} {s[:4]} {s[4:]}",
                        f"0{p}{s}", f"0{p} {s[:4]} {s[4:]}"])
    elif k < 0.75:
        a = rng.choice(["3", "6"])
        s = rng.choice("2345679") + digits(rng, 7)
        f = rng.choice([f"0{a}-{s[:4]}-{s[4:]}", f"+81 {a}-{s[:4]}-{s[4:]}", f"0{a}({s[:4]}){s[4:]}",
                        f"+81 {a} {s[:4]} {s[4:]}"])
    else:
        a = rng.choice(["45", "52", "92", "75", "78", "22", "82"])
        s = rng.choice("2345678") + digits(rng, 6)
        f = rng.choice([f"0{a}-{s[:3]}-{s[3:]}", f"+81 {a}-{s[:3]}-{s[3:]}"])
    return f, "JP"


def ph_cn(rng):
    k = rng.random()
    if k < 0.6:
        p = rng.choice(["138", "139", "135", "136", "137", "150", "151", "152", "158", "159", "186",
                        "187", "188", "189", "133", "153", "180", "181", "177", "199", "166"])
        s = digits(rng, 8)
        f = rng.choice([f"{p} {s[:4]} {s[4:]}", f"{p}{s}", f"+86 {p} {s[:4]} {s[4:]}",
                        f"+86-{p}-{s[:4]}-{s[4:]}", f"{p}-{s[:4]}-{s[4:]}", f"+86 {p}{s}"])
    else:
        a, s = rng.choice([("10", rng.choice("567") + digits(rng, 7)),
                           ("21", rng.choice("56") + digits(rng, 7)),
                           ("20", rng.choice("38") + digits(rng, 7)),
                           ("755", rng.choice("28") + digits(rng, 7))])
        f = rng.choice([f"0{a}-{s[:4]} {s[4:]}", f"(0{a}) {s[:4]}-{s[4:]}", f"+86 {a} {s[:4]} {s[4:]}",
                        f"0{a}-{s}"])
    return f, "CN"


def ph_tw(rng):
    if rng.random() < 0.5:
        s = "9" + digits(rng, 8)
        return rng.choice([f"0{s[:3]} {s[3:6]} {s[6:]}", f"+886 {s[:3]} {s[3:6]} {s[6:]}", f"0{s[:3]}-{s[3:]}"]), "TW"
    s = "2" + rng.choice("2345789") + digits(rng, 6)
    return rng.choice([f"+886 2 {s[:4]} {s[4:]}", f"(02) {s[:4]}-{s[4:]}", f"02-{s[:4]}-{s[4:]}"]), "TW"


def ph_hk(rng):
    s = rng.choice(["21", "23", "25", "27", "28", "29", "59", "61", "63", "64", "65", "69", "94", "96", "97"]) + digits(rng, 6)
    return rng.choice([f"+852 {s[:4]} {s[4:]}", f"{s[:4]} {s[4:]}", f"+852-{s[:4]}-{s[4:]}"]), "HK"


def ph_kr(rng):
    if rng.random() < 0.5:
        s = rng.choice("2345678") + digits(rng, 7)
        return rng.choice([f"010-{s[:4]}-{s[4:]}", f"+82 10-{s[:4]}-{s[4:]}"]), "KR"
    s = rng.choice("2345678") + digits(rng, 7)
    return rng.choice([f"02-{s[:4]}-{s[4:]}", f"+82 2-{s[:4]}-{s[4:]}"]), "KR"


def ph_ru(rng):
    if rng.random() < 0.5:
        a = "9" + rng.choice(["16", "03", "05", "15", "25", "26", "85", "77", "99", "62", "67", "10"])
    else:
        a = rng.choice(["495", "499", "812", "343", "383", "843"])
    s = rng.choice("2345679") + digits(rng, 6)
    f = rng.choice([f"+7 {a} {s[:3]}-{s[3:5]}-{s[5:]}", f"+7 ({a}) {s[:3]}-{s[3:5]}-{s[5:]}",
                    f"8 ({a}) {s[:3]}-{s[3:5]}-{s[5:]}", f"8 {a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"+7{a}{s}", f"8-{a}-{s[:3]}-{s[3:5]}-{s[5:]}"])
    return f, "RU"


def ph_tr(rng):
    if rng.random() < 0.55:
        a = "5" + rng.choice(["30", "32", "33", "35", "36", "38", "42", "43", "44", "05", "06",
                              "07", "52", "53", "55", "59"])
    else:
        a = rng.choice(["212", "216", "312", "232", "224", "242"])
    s = rng.choice("2345678") + digits(rng, 6)
    f = rng.choice([f"+90 {a} {s[:3]} {s[3:5]} {s[5:]}", f"0{a} {s[:3]} {s[3:5]} {s[5:]}",
                    f"0 ({a}) {s[:3]} {s[3:5]} {s[5:]}", f"+90 ({a}) {s[:3]} {s[3:]}", f"0{a}{s}"])
    return f, "TR"


def ph_ae(rng):
    if rng.random() < 0.6:
        p = "5" + rng.choice("024568")
        s = digits(rng, 7)
        f = rng.choice([f"+971 {p} {s[:3]} {s[3:]}", f"0{p} {s[:3]} {s[3:]}", f"+971{p}{s}",
                        f"+971-{p}-{s}"])
    else:
        p = rng.choice("2346")
        s = rng.choice("2345") + digits(rng, 6)
        f = rng.choice([f"+971 {p} {s[:3]} {s[3:]}", f"0{p} {s[:3]} {s[3:]}"])
    return f, "AE"


def ph_sa(rng):
    if rng.random() < 0.6:
        p = "5" + rng.choice("034569")
        s = digits(rng, 7)
        f = rng.choice([f"+966 {p} {s[:3]} {s[3:]}", f"0{p} {s[:3]} {s[3:]}", f"+966{p}{s}"])
    else:
        s = rng.choice("2456") + digits(rng, 6)
        f = rng.choice([f"+966 11 {s[:3]} {s[3:]}", f"011 {s[:3]} {s[3:]}"])
    return f, "SA"


def ph_eg(rng):
    p = "1" + rng.choice("0125")
    s = digits(rng, 8)
    return rng.choice([f"+20 {p} {s[:4]} {s[4:]}", f"0{p} {s[:4]} {s[4:]}"]), "EG"


def ph_in(rng):
    if rng.random() < 0.6:
        s = rng.choice("6789") + digits(rng, 9)
        f = rng.choice([f"+91 {s[:5]} {s[5:]}", f"+91-{s[:5]}-{s[5:]}", f"0{s[:5]} {s[5:]}", s,
                        f"+91 {s}", f"+91 {s[:3]} {s[3:6]} {s[6:]}"])
    else:
        a = rng.choice(["22", "11", "80", "44", "33", "40"])
        s = rng.choice("2346") + digits(rng, 7)
        f = rng.choice([f"+91 {a} {s[:4]} {s[4:]}", f"0{a}-{s[:4]}-{s[4:]}", f"0{a} {s}",
                        f"+91-{a}-{s}"])
    return f, "IN"


def ph_au(rng):
    if rng.random() < 0.5:
        s = "4" + rng.choice("012368") + digits(rng, 7)
        f = rng.choice([f"0{s[:3]} {s[3:6]} {s[6:]}", f"+61 {s[:3]} {s[3:6]} {s[6:]}", f"0{s}",
                        f"+61{s}", f"0{s[:3]}-{s[3:6]}-{s[6:]}"])
        return f, "AU"
    a, first = rng.choice([("2", "98"), ("3", "98"), ("7", "3"), ("8", "98")])
    s = rng.choice(first) + digits(rng, 7)
    f = rng.choice([f"(0{a}) {s[:4]} {s[4:]}", f"0{a} {s[:4]} {s[4:]}", f"+61 {a} {s[:4]} {s[4:]}",
                    f"+61 (0){a} {s[:4]} {s[4:]}"])
    return f, "AU"


def ph_ie(rng):
    if rng.random() < 0.5:
        p = "8" + rng.choice("35679")
        s = rng.choice("23456789") + digits(rng, 6)
        return rng.choice([f"0{p} {s[:3]} {s[3:]}", f"+353 {p} {s[:3]} {s[3:]}"]), "IE"
    s = rng.choice("2345678") + digits(rng, 6)
    return rng.choice([f"+353 1 {s[:3]} {s[3:]}", f"(01) {s[:3]} {s[3:]}"]), "IE"


def ph_se(rng):
    if rng.random() < 0.5:
        p = "7" + rng.choice("02369")
        s = digits(rng, 7)
        return rng.choice([f"0{p}-{s[:3]} {s[3:5]} {s[5:]}", f"+46 {p} {s[:3]} {s[3:5]} {s[5:]}"]), "SE"
    s = rng.choice("456") + digits(rng, 7)
    return rng.choice([f"08-{s[:3]} {s[3:6]} {s[6:]}", f"+46 8 {s[:3]} {s[3:6]} {s[6:]}"]), "SE"


def ph_il(rng):
    if rng.random() < 0.55:
        p = "5" + rng.choice("0234")
        s = rng.choice("2345678") + digits(rng, 6)
        return rng.choice([f"0{p}-{s[:3]}-{s[3:]}", f"+972 {p}-{s[:3]}-{s[3:]}", f"0{p}{s}"]), "IL"
    a = rng.choice(["3", "2", "4", "9"])
    s = rng.choice("56789") + digits(rng, 6)
    return rng.choice([f"0{a}-{s[:3]}-{s[3:]}", f"+972 {a}-{s[:3]}-{s[3:]}"]), "IL"


def ph_sg(rng):
    s = rng.choice(["6" + c for c in "012345678"] + ["8" + c for c in "123456789"] + ["9" + c for c in "012345678"]) + digits(rng, 6)
    return rng.choice([f"+65 {s[:4]} {s[4:]}", f"{s[:4]} {s[4:]}"]), "SG"


def ph_za(rng):
    if rng.random() < 0.5:
        p = rng.choice(["82", "83", "72", "73", "84", "76"])
        s = digits(rng, 7)
        return rng.choice([f"0{p} {s[:3]} {s[3:]}", f"+27 {p} {s[:3]} {s[3:]}"]), "ZA"
    a = rng.choice(["21", "11", "31"])
    s = rng.choice("2345") + digits(rng, 6)
    return rng.choice([f"0{a} {s[:3]} {s[3:]}", f"+27 {a} {s[:3]} {s[3:]}"]), "ZA"


PHONE_FUN = {"us": ph_us, "ca": ph_ca, "uk": ph_uk, "de": ph_de, "at": ph_at, "ch": ph_ch,
             "fr": ph_fr, "be": ph_be, "es": ph_es, "mx": ph_mx, "it": ph_it, "nl": ph_nl,
             "pl": ph_pl, "pt": ph_pt, "br": ph_br, "jp": ph_jp, "cn": ph_cn, "tw": ph_tw,
             "hk": ph_hk, "kr": ph_kr, "ru": ph_ru, "tr": ph_tr, "ae": ph_ae, "sa": ph_sa,
             "eg": ph_eg, "in": ph_in, "au": ph_au, "ie": ph_ie, "se": ph_se, "il": ph_il,
             "sg": ph_sg, "za": ph_za}

LANG_PHONE = {
    "en": ["us", "us", "us", "uk", "uk", "ca", "au", "ie", "in", "sg", "za", "de", "fr"],
    "de": ["de", "de", "de", "de", "at", "ch"],
    "fr": ["fr", "fr", "fr", "be", "ch"],
    "es": ["es", "es", "es", "mx"],
    "it": ["it", "it", "it", "ch"],
    "nl": ["nl", "nl", "nl", "be"],
    "pl": ["pl"],
    "pt": ["pt", "pt", "br", "br"],
    "ja": ["jp"],
    "zh": ["cn", "cn", "cn", "tw", "hk"],
    "ru": ["ru"],
    "ar": ["ae", "sa", "eg"],
    "hi": ["in"],
    "tr": ["tr"],
    "he": ["il"],
    "ko": ["kr"],
}

EXTS = [" ext. {n}", " x{n}", " ext {n}", " Ext. {n}", " extension {n}"]


def gen_phone(rng, mods, lang, meta):
    cc = next((m for m in mods if m in PHONE_FUN), None) or rng.choice(LANG_PHONE.get(lang, ["us"]))
    fun = PHONE_FUN[cc]
    if cc in ("uk", "de") and ("mob" in mods or "land" in mods):
        s, region = fun(rng, mob="mob" in mods)
    else:
        s, region = fun(rng)
    if "ext" in mods:
        s += rng.choice(EXTS).format(n=rng.choice([digits(rng, 3), digits(rng, 4), nzdigits(rng, 2)]))
    uni = next((m for m in mods if m in ("nbsp", "udash", "fw", "thin", "plainu")), None)
    if uni is None and "ascii" not in mods:
        r = rng.random()
        if lang in ("ja", "zh") and r < 0.25:
            uni = "fw"
        elif r < 0.07:
            uni = "nbsp"
        elif r < 0.12:
            uni = "udash"
        elif r < 0.14:
            uni = "thin"
    if uni == "nbsp":
        s = s.replace(" ", NBSP)
    elif uni == "thin":
        s = s.replace(" ", THIN)
    elif uni == "udash":
        if "-" in s:
            s = s.replace("-", rng.choice(["\u2011", "\u2013", "\u2010", "\u2012"]))
        else:
            s = s.replace(" ", NBSP)
    elif uni == "fw":
        s = fullwidth(s, keep_space=True).replace("(", "（").replace(")", "）").replace("+", "＋")
    meta.setdefault("phones", []).append((s, region))
    return s


# ----------------------------------------------------------------- names

def _split(s):
    return [x.strip() for x in s.split(",") if x.strip()]


FIRST = {
    "en": _split("James, Mary, Olivia, Liam, Priya, Chen, Mohammed, Sofia, Ethan, Grace, Daniel, Aisha, Noah, Emily, Lucas, Hannah, Raj, Megan, Tyler, Zoe, Marcus, Chloe, Jordan, Fatima, Owen, Rachel, Kevin, Laura, Samuel, Nina, Bridget, Declan, Harriet, Wesley, Imogen, Trevor, Keisha, Brandon, Siobhan, Callum"),
    "de": _split("Anna, Jörg, Jürgen, Lukas, Sabine, Katrin, Mehmet, Sophie, Maximilian, Uwe, Birgit, Felix, Lena, Stefan, Claudia, Tobias, Monika, Jan, Franziska, Dieter, Bärbel, Torsten, Hannelore, Malte, Ingrid, Sönke"),
    "fr": _split("Camille, Léa, Manon, Chloé, Julien, Nicolas, Thomas, Hélène, François, Amélie, Mathieu, Océane, Théo, Élodie, Sébastien, Nathalie, Gaëlle, Benoît, Aurélie, Loïc"),
    "es": _split("José, María, Lucía, Javier, Carmen, Alejandro, Sofía, Pablo, Marta, Sergio, Elena, Andrés, Paula, Raúl, Nuria, Álvaro, Begoña, Íñigo, Rocío, Agustín"),
    "it": _split("Giulia, Marco, Francesca, Alessandro, Chiara, Luca, Sara, Matteo, Valentina, Davide, Federica, Simone, Elisa, Andrea, Niccolò, Ludovica, Gianluca, Noemi"),
    "nl": _split("Daan, Sanne, Lotte, Bram, Sem, Emma, Thijs, Fleur, Jeroen, Ingrid, Ruben, Anouk, Pieter, Marloes, Joost, Femke"),
    "pl": _split("Anna, Katarzyna, Małgorzata, Piotr, Krzysztof, Tomasz, Agnieszka, Paweł, Michał, Magdalena, Łukasz, Joanna, Wojciech, Zofia, Grzegorz, Jadwiga"),
    "pt": _split("João, Ana, Beatriz, Pedro, Inês, Tiago, Mariana, Rafael, Luísa, Gonçalo, Camila, Lucas, Larissa, Thiago, Conceição"),
    "tr": _split("Mehmet, Ayşe, Mustafa, Fatma, Emre, Zeynep, Ahmet, Elif, Burak, Selin, Çağrı, Gökhan, Şule, Oğuz"),
}
LAST = {
    "en": _split("Smith, Johnson, O'Brien, Patel, Nguyen, Williams, Brown, Garcia, Miller, Davis, Wilson, Taylor, Anderson, Thomas, Moore, Martin, Jackson, White, Harris, Clark, Lewis, Walker, Hall, Young, King, Wright, Scott, Green, Baker, Adams, Campbell, Murphy, Kelly, Reid, Fraser, Okafor, Kowalczyk, Lindqvist, Delacroix, MacLeod"),
    "de": _split("Müller, Schmidt, Schneider, Fischer, Weber, Meyer, Wagner, Becker, Schulz, Hoffmann, Koch, Richter, Klein, Wolf, Schröder, Neumann, Schwarz, Zimmermann, Braun, Krüger, Hofmann, Hartmann, Lange, Werner, Krause, Köhler, Weiß, Yılmaz, Oßwald, Jäger"),
    "fr": _split("Martin, Bernard, Dubois, Thomas, Robert, Richard, Petit, Durand, Leroy, Moreau, Simon, Laurent, Lefèvre, Michel, Garnier, Rousseau, Fontaine, Chevalier, Girard, Mercier, Benoît, Bélanger"),
    "es": _split("García, Fernández, González, Rodríguez, López, Martínez, Sánchez, Pérez, Gómez, Martín, Jiménez, Ruiz, Hernández, Díaz, Moreno, Muñoz, Álvarez, Romero, Navarro, Núñez, Ibáñez, Castaño"),
    "it": _split("Rossi, Russo, Ferrari, Esposito, Bianchi, Romano, Colombo, Ricci, Marino, Greco, Bruno, Gallo, Conti, De Luca, Mancini, Costa, Giordano, Rizzo, Lombardi, Moretti, Fabbri, Caruso"),
    "nl": _split("de Jong, Jansen, de Vries, van den Berg, van Dijk, Bakker, Janssen, Visser, Smit, Meijer, de Boer, Mulder, de Groot, Bos, Vos, Peters, Hendriks, van Leeuwen"),
    "pl": _split("Nowak, Kowalski, Wiśniewski, Wójcik, Kowalczyk, Kamiński, Lewandowski, Zieliński, Szymański, Woźniak, Dąbrowski, Kozłowski, Jankowski, Mazur, Krawczyk, Piątek"),
    "pt": _split("Silva, Santos, Ferreira, Pereira, Oliveira, Costa, Rodrigues, Martins, Sousa, Fernandes, Gonçalves, Gomes, Lopes, Carvalho, Almeida, Ribeiro, Araújo"),
    "tr": _split("Yılmaz, Kaya, Demir, Çelik, Şahin, Yıldız, Öztürk, Aydın, Arslan, Doğan, Kılıç, Aslan, Çetin, Koç"),
}
# non-Latin scripts: (display first, display last, ascii first, ascii last)
NONLATIN = {
    "ja": [("太郎", "山田", "taro", "yamada"), ("花子", "佐藤", "hanako", "sato"), ("一郎", "鈴木", "ichiro", "suzuki"),
           ("美咲", "高橋", "misaki", "takahashi"), ("健", "田中", "ken", "tanaka"), ("さくら", "伊藤", "sakura", "ito"),
           ("翔", "渡辺", "sho", "watanabe"), ("優子", "中村", "yuko", "nakamura"), ("大輔", "小林", "daisuke", "kobayashi"),
           ("彩", "加藤", "aya", "kato"), ("直樹", "吉田", "naoki", "yoshida"), ("恵", "山本", "megumi", "yamamoto")],
    "zh": [("伟", "王", "wei", "wang"), ("娜", "李", "na", "li"), ("敏", "张", "min", "zhang"), ("洋", "刘", "yang", "liu"),
           ("静", "陈", "jing", "chen"), ("磊", "杨", "lei", "yang"), ("丽", "赵", "li", "zhao"), ("勇", "黄", "yong", "huang"),
           ("杰", "周", "jie", "zhou"), ("芳", "吴", "fang", "wu"), ("明", "徐", "ming", "xu"), ("强", "孙", "qiang", "sun"),
           ("嘉怡", "林", "jiayi", "lin"), ("志明", "郭", "zhiming", "guo")],
    "ru": [("Иван", "Петров", "ivan", "petrov"), ("Анна", "Смирнова", "anna", "smirnova"), ("Дмитрий", "Иванов", "dmitry", "ivanov"),
           ("Екатерина", "Кузнецова", "ekaterina", "kuznetsova"), ("Сергей", "Попов", "sergey", "popov"),
           ("Ольга", "Соколова", "olga", "sokolova"), ("Алексей", "Волков", "alexey", "volkov"),
           ("Наталья", "Морозова", "natalya", "morozova"), ("Михаил", "Лебедев", "mikhail", "lebedev"),
           ("Татьяна", "Новикова", "tatyana", "novikova"), ("Юлия", "Фёдорова", "yulia", "fedorova")],
    "ar": [("محمد", "العلي", "mohammed", "alali"), ("فاطمة", "الزهراني", "fatima", "alzahrani"), ("أحمد", "حسن", "ahmed", "hassan"),
           ("ليلى", "منصور", "layla", "mansour"), ("يوسف", "خليل", "yousef", "khalil"), ("مريم", "سعيد", "maryam", "saeed"),
           ("عمر", "الفارسي", "omar", "alfarsi"), ("نور", "الهاشمي", "noor", "alhashimi"), ("خالد", "عبدالله", "khalid", "abdullah")],
    "hi": [("राहुल", "शर्मा", "rahul", "sharma"), ("प्रिया", "वर्मा", "priya", "verma"), ("अमित", "पटेल", "amit", "patel"),
           ("नेहा", "गुप्ता", "neha", "gupta"), ("विकास", "सिंह", "vikas", "singh"), ("अंजलि", "मेहता", "anjali", "mehta"),
           ("सुनील", "यादव", "sunil", "yadav"), ("पूजा", "जोशी", "pooja", "joshi")],
    "he": [("דני", "כהן", "dani", "cohen"), ("נועה", "לוי", "noa", "levi"), ("יוסי", "מזרחי", "yossi", "mizrahi"),
           ("מיכל", "פרץ", "michal", "peretz"), ("אורי", "ביטון", "uri", "biton")],
}

DE_TRANS = {"ä": "ae", "ö": "oe", "ü": "ue", "ß": "ss", "Ä": "Ae", "Ö": "Oe", "Ü": "Ue"}
GEN_TRANS = {"ß": "ss", "ł": "l", "Ł": "L", "ı": "i", "İ": "I", "ø": "o", "æ": "ae", "œ": "oe", "đ": "d"}


def ascii_name(s, lang):
    if lang == "de":
        s = "".join(DE_TRANS.get(c, c) for c in s)
    s = "".join(GEN_TRANS.get(c, c) for c in s)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.combining(c))
    return re.sub(r"[^A-Za-z]", "", s).lower()


def make_persona(rng, lang):
    if lang in NONLATIN:
        f, l, fa, la = rng.choice(NONLATIN[lang])
        full = l + f if lang in ("ja", "zh") else f + " " + l
        return {"first": f, "last": l, "fa": fa, "la": la, "full": full, "lang": lang}
    base = lang if lang in FIRST else "en"
    f, l = rng.choice(FIRST[base]), rng.choice(LAST[base])
    return {"first": f, "last": l, "fa": ascii_name(f, base), "la": ascii_name(l, base),
            "full": f + " " + l, "lang": base}


# ----------------------------------------------------------------- e-mail

DOMAINS = {
    "en": ["example.com", "example.org", "example.net", "mail.example.com", "contoso.com", "fabrikam.com",
           "northwindtraders.com", "adatum.com", "tailspintoys.com", "wingtiptoys.com", "initech.io",
           "globex-corp.com", "example.co.uk", "example.com.au", "brightlane-consulting.com",
           "hollowbrook.org", "corp.example.net", "lists.example.org", "students.example.edu"],
    "de": ["beispiel.de", "example.de", "mueller-bau.de", "kanzlei-hartmann.de", "praxis-am-see.de",
           "stadtwerke-beispiel.de", "example.at", "beispiel.ch", "mail.beispiel.de", "autohaus-beispiel.de"],
    "fr": ["exemple.fr", "example.fr", "societe-exemple.fr", "mairie-exemple.fr", "cabinet-dupont.fr",
           "example.be", "exemple.ch", "courriel.exemple.fr"],
    "es": ["ejemplo.es", "example.es", "correo-ejemplo.com", "inmobiliaria-sol.es", "ejemplo.com.mx",
           "clinica-ejemplo.es", "ejemplo.org"],
    "it": ["esempio.it", "example.it", "studio-rossi.it", "ditta-esempio.it", "comune-esempio.it", "pec.esempio.it"],
    "nl": ["voorbeeld.nl", "example.nl", "bakkerij-visser.nl", "voorbeeld.be", "gemeente-voorbeeld.nl"],
    "pl": ["przyklad.pl", "example.pl", "firma-przyklad.com.pl", "poczta.przyklad.pl"],
    "pt": ["exemplo.pt", "exemplo.com.br", "example.pt", "empresa-exemplo.com.br"],
    "ja": ["example.jp", "example.co.jp", "rei.example.jp", "sample-shoji.co.jp", "example.ne.jp"],
    "zh": ["example.cn", "example.com.cn", "shili.example.cn", "example.com.tw", "example.hk"],
    "ru": ["primer.ru", "example.ru", "firma-primer.ru", "mail.primer.ru"],
    "ar": ["example.ae", "example.sa", "mithal.example.com", "example.com.eg"],
    "hi": ["example.in", "udaharan.co.in", "example.co.in"],
    "tr": ["ornek.com.tr", "example.com.tr", "sirket-ornek.com.tr"],
    "he": ["example.co.il", "dugma.example.co.il"],
}
IDN_DOMAINS = {
    "en": ["müller.de", "zoë-design.example", "bücher.example", "café-example.com"],
    "de": ["müller.de", "bäckerei-köhler.de", "straßenbau-weiß.de", "bücher-wurm.de", "grün-und-blau.de"],
    "fr": ["société-exemple.fr", "café-exemple.fr", "élysée-exemple.fr"],
    "es": ["españa-correo.es", "niño-ejemplo.es", "peñalara-ejemplo.es"],
    "it": ["città-esempio.it", "perché-esempio.it"],
    "nl": ["voorbeeld.nl"],
    "pl": ["przykład.pl", "żółw-przykład.pl", "łódź-firma.pl"],
    "pt": ["exemplo-ação.pt", "informação-exemplo.com.br"],
    "ja": ["例え.jp", "例え.テスト", "会社.jp", "サンプル.jp"],
    "zh": ["例子.广告", "例子.公司", "公司.中国", "例子.中国"],
    "ru": ["пример.рф", "компания-пример.рф", "пример.испытание"],
    "ar": ["مثال.امارات", "مثال.السعودية", "مثال.إختبار"],
    "hi": ["उदाहरण.भारत", "उदाहरण.परीक्षा"],
    "tr": ["örnek-şirket.com.tr", "çiçekçi-örnek.com.tr"],
    "he": ["דוגמה.ישראל", "דוגמה.טעסט"],
}
ROLES = {
    "en": ["info", "support", "billing", "hr", "accounts", "privacy", "help", "sales", "office", "admin", "jobs"],
    "de": ["info", "kontakt", "buchhaltung", "personal", "service", "datenschutz", "bewerbung", "verwaltung"],
    "fr": ["contact", "info", "compta", "rh", "service-client", "accueil", "facturation"],
    "es": ["info", "contacto", "facturacion", "rrhh", "atencion.cliente", "reservas"],
    "it": ["info", "amministrazione", "segreteria", "assistenza", "ufficio.personale"],
    "nl": ["info", "klantenservice", "administratie", "contact"],
    "pl": ["biuro", "kontakt", "ksiegowosc", "info", "obsluga"],
    "pt": ["contato", "geral", "faturacao", "suporte", "rh"],
    "ja": ["info", "support", "kojin-joho", "saiyo"],
    "zh": ["service", "kefu", "hr", "info"],
    "ru": ["info", "office", "buh", "support", "zakaz"],
    "ar": ["info", "support", "hr"],
    "hi": ["info", "support", "care"],
    "tr": ["info", "destek", "muhasebe", "ik"],
    "he": ["info", "office"],
}
IDN_LOCAL = {
    "ja": ["山田", "さくら", "問い合わせ", "田中健", "佐藤花子"],
    "zh": ["用户", "王伟", "客服", "李娜", "联系"],
    "ru": ["иван.петров", "почта", "анна", "info", "отдел.кадров"],
    "ar": ["محمد", "معلومات", "ليلى"],
    "hi": ["राहुल", "संपर्क", "प्रिया"],
    "he": ["דני", "מידע"],
}


def email_local(rng, p):
    fa, la = p["fa"], p["la"]
    return rng.choice([f"{fa}.{la}", f"{fa}.{la}", f"{fa[0]}{la}", f"{fa}_{la}", f"{la}.{fa}",
                       f"{fa}{la}{rng.randint(1, 99)}", f"{fa}", f"{fa[0]}.{la}", f"{fa}.{la}{rng.randint(70, 99)}",
                       f"{la}{fa[0]}", f"{fa}-{la}"])


def obfuscate(rng, local, domain, lang):
    parts = domain.split(".")
    style = rng.choice(["br", "br", "paren", "words", "curly", "brc", "paren2", "caps", "dotonly", "spaced"]
                       + (["arroba"] if lang == "es" else [])
                       + (["arobase"] if lang == "fr" else [])
                       + (["klammer"] if lang == "de" else [])
                       + (["punkt"] if lang == "de" else []))
    if style == "br":
        return f"{local} [at] " + " [dot] ".join(parts)
    if style == "brc":
        return f"{local}[at]" + domain
    if style == "paren":
        return f"{local}(at){domain}"
    if style == "paren2":
        return f"{local} (at) " + " (dot) ".join(parts)
    if style == "words":
        return f"{local} at " + " dot ".join(parts)
    if style == "curly":
        return f"{local} {{at}} " + " {dot} ".join(parts)
    if style == "caps":
        return f"{local} AT " + " DOT ".join(parts)
    if style == "dotonly":
        return f"{local}@" + " [dot] ".join(parts)
    if style == "spaced":
        return f"{local} @ {domain}"
    if style == "arroba":
        return f"{local} (arroba) " + " (punto) ".join(parts)
    if style == "arobase":
        return f"{local} arobase " + " point ".join(parts)
    if style == "klammer":
        return f"{local} (ät) {domain}"
    if style == "punkt":
        return f"{local} at " + " punkt ".join(parts)
    raise KeyError(style)


def gen_email(rng, mods, lang, persona):
    dl = DOMAINS.get(lang, DOMAINS["en"])
    style = next((m for m in mods if m in ("plain", "obf", "idn", "fw", "upper", "role", "plus", "shy",
                                          "nfd")), None)
    if style is None:
        style = wchoice(rng, [("plain", 52), ("obf", 16), ("idn", 9), ("fw", 5), ("upper", 4),
                              ("role", 10), ("plus", 4)])
    p = persona if (persona and rng.random() < 0.7) else make_persona(rng, lang)
    if "r" in mods:
        p = make_persona(rng, lang)
    local = email_local(rng, p)
    domain = rng.choice(dl)
    if style == "plain":
        return f"{local}@{domain}"
    if style == "role":
        return f"{rng.choice(ROLES.get(lang, ROLES['en']))}@{domain}"
    if style == "plus":
        return f"{local}+{rng.choice(['news', 'shop', 'invoices', 'spam', 'test', 'amazon', 'jobs'])}@{domain}"
    if style == "upper":
        return f"{local}@{domain}".upper()
    if style == "obf":
        return obfuscate(rng, local, domain, lang)
    if style == "fw":
        return f"{local}＠{domain}"
    if style == "shy":
        d = domain.split(".")
        w = d[0]
        k = max(2, len(w) // 2)
        d[0] = w[:k] + SHY + w[k:]
        return f"{local}@" + ".".join(d)
    if style == "nfd":
        if lang in IDN_LOCAL:
            return f"{local}@{domain}"
        loc = (p["first"] + "." + p["last"]).lower().replace(" ", "")
        return unicodedata.normalize("NFD", loc) + "@" + domain
    if style == "idn":
        idom = rng.choice(IDN_DOMAINS.get(lang, IDN_DOMAINS["en"]))
        if lang in IDN_LOCAL:
            loc = rng.choice(IDN_LOCAL[lang])
            return f"{loc}@{idom if rng.random() < 0.7 else domain}"
        loc = (p["first"] + "." + p["last"]).lower().replace(" ", "").replace("'", "")
        if rng.random() < 0.5:
            loc = p["first"].lower()
        return f"{loc}@{idom if rng.random() < 0.75 else domain}"
    raise KeyError(style)


# ----------------------------------------------------------------- credentials

def b64url(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def jwt(rng, long_sig=False):
    alg = "RS256" if long_sig else rng.choice(["HS256", "HS256", "HS512", "ES256"])
    header = {"alg": alg, "typ": "JWT"}
    if rng.random() < 0.3:
        header["kid"] = rstr(rng, HEX, 16)
    iat = rng.randint(1760000000, 1790000000)
    payload = {"sub": rng.choice([str(uuid.UUID(int=rng.getrandbits(128), version=4)), str(rng.randint(10000, 9999999))]),
               "iat": iat, "exp": iat + rng.choice([900, 3600, 86400])}
    if rng.random() < 0.5:
        payload["scope"] = rng.choice(["read write", "orders:read", "admin", "openid profile"])
    if rng.random() < 0.4:
        payload["iss"] = rng.choice(["https://auth.example.com", "https://login.example.org/", "api-gateway"])
    siglen = 256 if long_sig else {"HS256": 32, "HS512": 64, "ES256": 64}[alg]
    sig = bytes(rng.getrandbits(8) for _ in range(siglen))
    h = b64url(json.dumps(header, separators=(",", ":")).encode())
    p = b64url(json.dumps(payload, separators=(",", ":")).encode())
    return f"{h}.{p}.{b64url(sig)}"


PW_WORDS = {
    "en": ["Sunshine", "Dragon", "Monkey", "Baseball", "Charlie", "Summer", "Winter", "Falcon", "Pepper",
           "Harbor", "Maple", "Orchid", "Tiger", "Rocket", "Coffee", "Lighthouse", "Bluebird"],
    "de": ["Sonne", "Winter", "Katze", "Hamburg", "Schalke", "Frühling", "Bergwerk", "Apfelbaum", "Mauseloch", "Sommer"],
    "fr": ["Soleil", "Printemps", "Chaton", "Marseille", "Bonjour", "Papillon", "Fromage", "Etoile"],
    "es": ["Verano", "Girasol", "Madrid", "Gatito", "Mariposa", "Futbol", "Tortuga", "Estrella"],
    "it": ["Estate", "Girasole", "Juventus", "Gattino", "Farfalla", "Roma", "Pizza", "Stella"],
    "nl": ["Zomer", "Fiets", "Tulp", "Ajax", "Molen", "Hagelslag"],
    "pl": ["Lato", "Kotek", "Warszawa", "Slonce", "Biedronka", "Zubr"],
    "pt": ["Saudade", "Benfica", "Gatinho", "Praia", "Sereia", "Brasil"],
    "tr": ["Galatasaray", "Kedi", "Istanbul", "Deniz", "Bahar", "Lale"],
    "ru": ["Solnce", "Koshka", "Moskva", "Zvezda", "Medved", "Vesna"],
}
SYMS = "!#$%&*?@+-_.="


def gen_password(rng, lang):
    words = PW_WORDS.get(lang, PW_WORDS["en"])
    k = rng.random()
    if k < 0.3:
        w = rng.choice(words)
        return w + rng.choice("!#$%&*?") + str(rng.randint(1970, 2026))
    if k < 0.45:
        w = rng.choice(words).lower()
        w = w.replace("o", "0", 1).replace("a", "4", 1).replace("e", "3", 1)
        return w[0].upper() + w[1:] + rng.choice("!#$%&*") + str(rng.randint(1, 99))
    if k < 0.75:
        n = rng.randint(10, 18)
        while True:
            s = rstr(rng, ALNUM + "!#$%&*?+-_=", n)
            if any(c.isdigit() for c in s) and any(c.isupper() for c in s) and s[-1] not in ".,":
                return s
    if k < 0.88:
        ws = [rng.choice(words).lower() for _ in range(3)] + [str(rng.randint(10, 999))]
        rng.shuffle(ws)
        return rng.choice("-_.").join(ws)
    n = rng.randint(8, 11)
    return rstr(rng, ALNUM, n - 3) + rng.choice("!#$%&*") + digits(rng, 2)


def pem_block(label, der, width=64):
    b = base64.b64encode(der).decode()
    lines = [b[i:i + width] for i in range(0, len(b), width)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


def rbytes(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def gen_pem(rng, kind):
    if kind == "pem_rsa":
        if rng.random() < 0.4:
            der = bytes.fromhex("3082025c02010002818100") + rbytes(rng, 596)
        else:
            der = bytes.fromhex("308204a40201000282010100") + rbytes(rng, 1180)
        return pem_block("RSA PRIVATE KEY", der)
    if kind == "pem_pkcs8":
        der = bytes.fromhex("30820276020100300d06092a864886f70d0101010500048202603082025c02010002818100") + rbytes(rng, 596)
        if rng.random() < 0.4:
            der = bytes.fromhex("302e020100300506032b657004220420") + rbytes(rng, 32)
        return pem_block("PRIVATE KEY", der)
    if kind == "pem_ec":
        der = (bytes.fromhex("30770201010420") + rbytes(rng, 32) + bytes.fromhex("a00a06082a8648ce3d030107a144034200")
               + b"\x04" + rbytes(rng, 64))
        return pem_block("EC PRIVATE KEY", der)
    if kind in ("pem_openssh", "pem_openssh_split"):
        body = (b"openssh-key-v1\x00" + b"\x00\x00\x00\x04none\x00\x00\x00\x04none\x00\x00\x00\x00\x00\x00\x00\x01"
                + b"\x00\x00\x00\x33\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + rbytes(rng, 32)
                + b"\x00\x00\x00\x88" + rbytes(rng, 8) + b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"
                + rbytes(rng, 32) + b"\x00\x00\x00\x40" + rbytes(rng, 64) + b"\x00\x00\x00\x00\x01\x02\x03\x04\x05")
        s = pem_block("OPENSSH PRIVATE KEY", body, width=70)
        if kind == "pem_openssh_split":
            # pasted from a narrow terminal: the BEGIN header is broken over two
            # lines (mid-word at the terminal width, or at a space), body lines wrap too
            cut, width = rng.choice([(24, 24), (26, 40), (18, 36), (30, 30)])
            first = "-----BEGIN OPENSSH PRIVATE KEY-----"
            head = first[:cut] + "\n" + first[cut:].lstrip(" ")
            body = s[len(first) + 1:].split("\n")
            out = []
            for ln in body:
                while len(ln) > width and not ln.startswith("-----"):
                    out.append(ln[:width])
                    ln = ln[width:]
                out.append(ln)
            s = head + "\n" + "\n".join(out)
        return s
    raise KeyError(kind)


DB_HOSTS = ["db.internal", "db-prod.internal", "pg-main.svc.cluster.local", "mysql01.corp.example.net",
            "postgres.example.com", "db.staging.example.org", "cache.internal", "rabbit.internal",
            "sqlsrv02.example.local", "reporting-db.example.net"]


def gen_dburl(rng, with_at=False, lang="en"):
    user = rng.choice(["app", "admin", "root", "postgres", "svc_orders", "report_ro", "django", "etl", "shop"])
    pw = gen_password(rng, lang)
    pw = re.sub(r"[/:@?#%]", "", pw) or "Pw9x"
    if with_at:
        i = rng.randint(1, max(1, len(pw) - 1))
        pw = pw[:i] + "@" + pw[i:]
    scheme, port, path = rng.choice([("postgres", 5432, "/app"), ("postgresql", 5432, "/orders"),
                                     ("mysql", 3306, "/shop"), ("mongodb+srv", None, "/prod?retryWrites=true"),
                                     ("redis", 6379, "/0"), ("amqp", 5672, "/%2F"), ("mysql", 3306, "/wordpress"),
                                     ("postgresql+psycopg2", 5432, "/analytics"), ("mongodb", 27017, "/admin")])
    host = rng.choice(DB_HOSTS)
    if scheme.startswith("mongodb+srv"):
        host = "cluster0." + rstr(rng, string.ascii_lowercase + string.digits, 5) + ".mongodb.net"
    hp = host + (f":{port}" if port else "")
    if scheme == "redis" and rng.random() < 0.5:
        return f"redis://:{pw}@{hp}{path}"
    return f"{scheme}://{user}:{pw}@{hp}{path}"


def gen_cred(rng, mods, lang):
    kinds = ["aws_id", "aws_secret", "openai", "openai_legacy", "anthropic", "ghp", "github_pat", "glpat",
             "slack", "slackp", "stripe", "stripe_rk", "google", "sendgrid", "twilio", "npm", "pypi", "hf",
             "jwt", "jwt_rs", "bearer", "pw", "dburl", "dburl_at", "pem_rsa", "pem_pkcs8", "pem_ec",
             "pem_openssh", "pem_openssh_split", "hex32", "giturl", "gho"]
    kind = next((m for m in mods if m in kinds), None)
    if kind is None:
        kind = rng.choice(["openai", "anthropic", "ghp", "github_pat", "glpat", "slack", "stripe", "google",
                           "sendgrid", "npm", "hf", "aws_id", "stripe_rk", "twilio", "openai_legacy"])
    U = string.ascii_uppercase
    if kind == "aws_id":
        return rng.choice(["AKIA", "AKIA", "AKIA", "ASIA"]) + rstr(rng, U + "234567", 16)
    if kind == "aws_secret":
        return rstr(rng, ALNUM + "/+", 40)
    if kind == "openai":
        n = rng.choice([64, 74])
        return "sk-proj-" + rstr(rng, B64URL, n) + "T3BlbkFJ" + rstr(rng, B64URL, n)
    if kind == "openai_legacy":
        return "sk-" + rstr(rng, ALNUM, 20) + "T3BlbkFJ" + rstr(rng, ALNUM, 20)
    if kind == "anthropic":
        return "sk-ant-api03-" + rstr(rng, B64URL, 93) + "AA"
    if kind == "ghp":
        return rng.choice(["ghp_", "ghp_", "ghs_", "ghu_"]) + rstr(rng, ALNUM, 36)
    if kind == "gho":
        return "gho_" + rstr(rng, ALNUM, 36)
    if kind == "github_pat":
        return "github_pat_11" + rstr(rng, U + string.digits, 20) + "_" + rstr(rng, ALNUM, 59)
    if kind == "glpat":
        return "glpat-" + rstr(rng, B64URL, 20)
    if kind == "slack":
        return f"xoxb-{nzdigits(rng, 11)}-{nzdigits(rng, 13)}-{rstr(rng, ALNUM, 24)}"
    if kind == "slackp":
        return f"xoxp-{nzdigits(rng, 11)}-{nzdigits(rng, 11)}-{nzdigits(rng, 13)}-{rstr(rng, HEX, 32)}"
    if kind == "stripe":
        if rng.random() < 0.5:
            return "sk_live_" + rstr(rng, ALNUM, 24)
        return "sk_live_51" + rstr(rng, ALNUM, 97)
    if kind == "stripe_rk":
        if rng.random() < 0.5:
            return "rk_live_" + rstr(rng, ALNUM, 24)
        return "rk_live_51" + rstr(rng, ALNUM, 97)
    if kind == "google":
        return "AIza" + rstr(rng, B64URL, 35)
    if kind == "sendgrid":
        return "SG." + rstr(rng, B64URL, 22) + "." + rstr(rng, B64URL, 43)
    if kind == "twilio":
        return "SK" + rstr(rng, HEX, 32)
    if kind == "hex32":
        return rstr(rng, HEX, 32)
    if kind == "npm":
        return "npm_" + rstr(rng, ALNUM, 36)
    if kind == "pypi":
        return "pypi-AgEIcHlwaS5vcmc" + rstr(rng, B64URL, rng.randint(130, 170))
    if kind == "hf":
        return "hf_" + rstr(rng, string.ascii_letters, 34)
    if kind == "jwt":
        return jwt(rng)
    if kind == "jwt_rs":
        return jwt(rng, long_sig=True)
    if kind == "bearer":
        return rstr(rng, ALNUM, rng.choice([32, 40, 48, 64]))
    if kind == "pw":
        return gen_password(rng, lang)
    if kind == "dburl":
        return gen_dburl(rng, False, lang)
    if kind == "dburl_at":
        return gen_dburl(rng, True, lang)
    if kind == "giturl":
        tok = rng.choice(["glpat-" + rstr(rng, B64URL, 20), "ghp_" + rstr(rng, ALNUM, 36)])
        user = "oauth2" if tok.startswith("glpat") else rng.choice(["x-access-token", "ci-bot"])
        host = "gitlab.example.com" if tok.startswith("glpat") else "github.com"
        return f"https://{user}:{tok}@{host}/{rng.choice(['acme', 'infra', 'platform'])}/{rng.choice(['deploy', 'site', 'terraform-live'])}.git"
    if kind.startswith("pem"):
        return gen_pem(rng, kind)
    raise KeyError(kind)


# ----------------------------------------------------------------- filler values (never labelled)

COMPANIES = {
    "en": ["Northwind Traders Ltd", "Brightlane Consulting", "Hollowbrook Logistics", "Contoso Pharmaceuticals",
           "Fabrikam Inc.", "Tailspin Toys", "Initech LLC", "Globex Corporation", "Redwood Dental Group"],
    "de": ["Müller Bau GmbH", "Kanzlei Hartmann & Partner", "Stadtwerke Beispielstadt", "Praxis am See",
           "Autohaus Becker KG", "Elektro Schulz e.K."],
    "fr": ["Société Exemple SARL", "Cabinet Dupont", "Boulangerie Martin", "Transports Leroy SA"],
    "es": ["Inmobiliaria Sol S.L.", "Clínica Ejemplo", "Talleres García", "Distribuciones Ruiz S.A."],
    "it": ["Studio Rossi", "Ditta Esempio S.r.l.", "Ferramenta Bianchi", "Trasporti Conti S.p.A."],
    "nl": ["Bakkerij Visser", "Installatiebedrijf de Groot", "Van Dijk Advocaten"],
    "pl": ["Firma Przykład Sp. z o.o.", "Biuro Rachunkowe Nowak", "Kowalski i Synowie"],
    "pt": ["Empresa Exemplo Lda.", "Construtora Silva", "Padaria Pereira"],
    "ja": ["株式会社サンプル商事", "山田工業株式会社", "有限会社テスト"],
    "zh": ["示例科技有限公司", "上海样本贸易有限公司", "北京例子网络"],
    "ru": ["ООО «Пример»", "АО «Тест-Сервис»", "ИП Петров"],
    "ar": ["شركة المثال للتجارة", "مؤسسة النور", "شركة الخليج للخدمات"],
    "hi": ["उदाहरण प्राइवेट लिमिटेड", "शर्मा ट्रेडर्स"],
    "tr": ["Örnek Yazılım A.Ş.", "Kaya Lojistik Ltd. Şti."],
    "he": ["דוגמה בע\"מ", "כהן ושות'"],
}
ADDRESSES = {
    "en": ["221 Harbor Street, Suite 400, Portland, OR 97204", "14 Kingsway, London WC2B 6XF",
           "88 Collins Street, Melbourne VIC 3000", "1500 Market St, Philadelphia, PA 19102",
           "3 Grand Canal Quay, Dublin 2", "77 King Street West, Toronto, ON M5K 1A1"],
    "de": ["Hauptstraße 12, 10115 Berlin", "Lindenallee 4a, 80331 München", "Am Markt 7, 50667 Köln",
           "Bahnhofstraße 21, 8001 Zürich", "Mariahilfer Straße 45, 1060 Wien"],
    "fr": ["12 rue de la Paix, 75002 Paris", "4 place Bellecour, 69002 Lyon", "Avenue Louise 54, 1050 Bruxelles"],
    "es": ["Calle Mayor 15, 28013 Madrid", "Passeig de Gràcia 43, 08007 Barcelona", "Av. Reforma 222, CDMX"],
    "it": ["Via Roma 10, 00184 Roma", "Corso Buenos Aires 33, 20124 Milano", "Piazza Dante 2, 80135 Napoli"],
    "nl": ["Keizersgracht 123, 1015 CJ Amsterdam", "Coolsingel 40, 3011 AD Rotterdam"],
    "pl": ["ul. Marszałkowska 10, 00-590 Warszawa", "ul. Floriańska 3, 31-019 Kraków"],
    "pt": ["Rua Augusta 100, 1100-053 Lisboa", "Av. Paulista 1000, São Paulo - SP"],
    "ja": ["東京都千代田区丸の内1-1-1", "大阪府大阪市北区梅田2-4-9"],
    "zh": ["北京市朝阳区建国路88号", "上海市浦东新区世纪大道100号"],
    "ru": ["г. Москва, ул. Тверская, д. 7", "г. Санкт-Петербург, Невский пр., д. 28"],
    "ar": ["دبي، شارع الشيخ زايد، برج 3", "الرياض، طريق الملك فهد"],
    "hi": ["कनॉट प्लेस, नई दिल्ली 110001", "बांद्रा पश्चिम, मुंबई 400050"],
    "tr": ["İstiklal Cad. No: 45, Beyoğlu / İstanbul", "Atatürk Bulvarı 112, Çankaya / Ankara"],
    "he": ["רחוב הרצל 10, תל אביב", "שדרות רוטשילד 22, תל אביב"],
}
MONTHS = {
    "en": ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"],
    "de": ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober", "November", "Dezember"],
    "fr": ["janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre", "novembre", "décembre"],
    "es": ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre", "noviembre", "diciembre"],
    "it": ["gennaio", "febbraio", "marzo", "aprile", "maggio", "giugno", "luglio", "agosto", "settembre", "ottobre", "novembre", "dicembre"],
    "nl": ["januari", "februari", "maart", "april", "mei", "juni", "juli", "augustus", "september", "oktober", "november", "december"],
    "pt": ["janeiro", "fevereiro", "março", "abril", "maio", "junho", "julho", "agosto", "setembro", "outubro", "novembro", "dezembro"],
}
CURRENCY = {"en": ["${a}", "£{a}", "USD {a}", "${a}"], "de": ["{a} €", "{a} EUR", "CHF {a}"],
            "fr": ["{a} €", "{a} EUR"], "es": ["{a} €", "{a} MXN"], "it": ["€ {a}", "{a} €"],
            "nl": ["€ {a}", "€{a}"], "pl": ["{a} zł", "{a} PLN"], "pt": ["{a} €", "R$ {a}"],
            "ja": ["¥{a}", "{a}円"], "zh": ["¥{a}", "{a}元", "RMB {a}"], "ru": ["{a} ₽", "{a} руб."],
            "ar": ["{a} درهم", "{a} ر.س", "AED {a}"], "hi": ["₹{a}", "Rs. {a}"], "tr": ["{a} TL", "₺{a}"],
            "he": ["₪{a}", "{a} ש\"ח"]}
COMMA_DEC = {"de", "fr", "es", "it", "nl", "pl", "pt", "ru", "tr"}


def fmt_amount(rng, lang):
    v = rng.choice([rng.randint(5, 99) + rng.choice([0, 0.5, 0.99, 0.9, 0.49]), rng.randint(100, 9999) + rng.randint(0, 99) / 100,
                    rng.randint(10000, 250000) + 0.0])
    if lang in ("ja",):
        return f"{int(v):,}"
    s = f"{v:,.2f}"
    if lang in COMMA_DEC:
        s = s.replace(",", "X").replace(".", ",").replace("X", "." if lang in ("de", "it", "nl", "pt", "tr", "es") else " ")
    return s


def fmt_date(rng, lang):
    y, m, d = rng.choice([2025, 2026, 2026, 2027]), rng.randint(1, 12), rng.randint(1, 28)
    if lang in ("ja", "zh"):
        return rng.choice([f"{y}年{m}月{d}日", f"{y}/{m:02d}/{d:02d}", f"{y}-{m:02d}-{d:02d}"])
    if lang in ("de", "ru", "pl", "tr"):
        return rng.choice([f"{d:02d}.{m:02d}.{y}", f"{d}.{m}.{y}", f"{y}-{m:02d}-{d:02d}"]
                          + ([f"{d}. {MONTHS['de'][m - 1]} {y}"] if lang == "de" else []))
    if lang in ("fr", "es", "it", "pt", "nl"):
        mon = MONTHS[lang][m - 1]
        longf = {"fr": f"{d} {mon} {y}", "es": f"{d} de {mon} de {y}", "it": f"{d} {mon} {y}",
                 "pt": f"{d} de {mon} de {y}", "nl": f"{d} {mon} {y}"}[lang]
        return rng.choice([f"{d:02d}/{m:02d}/{y}", longf, f"{d:02d}-{m:02d}-{y}" if lang == "nl" else f"{d:02d}/{m:02d}/{y}"])
    return rng.choice([f"{MONTHS['en'][m - 1]} {d}, {y}", f"{y}-{m:02d}-{d:02d}", f"{m}/{d}/{y}",
                       f"{d} {MONTHS['en'][m - 1][:3]} {y}"])


def isbn13(rng):
    body = "978" + rng.choice(["0", "1", "3", "2", "84", "88", "4"])
    body += digits(rng, 12 - len(body))
    s = sum(int(c) * (1 if i % 2 == 0 else 3) for i, c in enumerate(body))
    full = body + str((10 - s % 10) % 10)
    return rng.choice([full, f"{full[:3]}-{full[3]}-{full[4:7]}-{full[7:12]}-{full[12]}"])


def ean13(rng):
    while True:
        body = rng.choice(["400", "401", "590", "800", "880", "690", "500", "870"]) + digits(rng, 9)
        s = sum(int(c) * (1 if i % 2 == 0 else 3) for i, c in enumerate(body))
        full = body + str((10 - s % 10) % 10)
        if not luhn_ok(full):
            return full


def bad16(rng, first=None):
    while True:
        n = (first or rng.choice("3456")) + digits(rng, 15)
        if not luhn_ok(n):
            return n


def ups(rng):
    return "1Z" + rstr(rng, string.ascii_uppercase + string.digits, 6) + digits(rng, 10)


def ver4(rng):
    return "%d.%d.%d.%d" % (rng.randint(1, 24), rng.randint(0, 20), rng.randint(0, 30), rng.randint(0, 250))


def semver(rng):
    return "%d.%d.%d" % (rng.randint(0, 19), rng.randint(0, 40), rng.randint(0, 30))


BICS = {"en": ["NWBKGB2L", "BARCGB22", "AIBKIE2D", "DEUTDEFF", "BNPAFRPP"], "de": ["COBADEFFXXX", "DEUTDEDBBER", "GENODEF1S04", "BYLADEM1001", "RZOOAT2L"],
        "fr": ["BNPAFRPPXXX", "AGRIFRPP882", "SOGEFRPP"], "es": ["CAIXESBBXXX", "BBVAESMM", "BSCHESMM"],
        "it": ["UNCRITMM", "BCITITMM", "BPMOIT22XXX"], "nl": ["ABNANL2A", "INGBNL2A", "RABONL2U"],
        "pl": ["PKOPPLPW", "BPKOPLPW"], "pt": ["CGDIPTPL", "BCOMPTPL"], "tr": ["TGBATRIS", "ISBKTRIS"],
        "ar": ["NBADAEAA", "NCBKSAJE"]}


def filler(name, mods, ctx):
    rng, lang, p = ctx.rng, ctx.lang, ctx.persona
    if name == "P":
        ctx.persona = make_persona(rng, lang)
        return ""
    if name == "NAME":
        return p["full"]
    if name == "FIRST":
        return p["first"]
    if name == "LAST":
        return p["last"]
    if name == "FIRSTLOWER":
        return p["fa"]
    if name == "RNAME":
        return make_persona(rng, lang)["full"]
    if name == "RFIRST":
        return make_persona(rng, lang)["first"]
    if name == "COMPANY":
        return rng.choice(COMPANIES.get(lang, COMPANIES["en"]))
    if name == "ADDRESS":
        return rng.choice(ADDRESSES.get(lang, ADDRESSES["en"]))
    if name == "DATE":
        return fmt_date(rng, lang)
    if name == "ISODATE":
        return "2026-%02d-%02d" % (rng.randint(1, 12), rng.randint(1, 28))
    if name == "TS":
        return "2026-%02d-%02dT%02d:%02d:%02d%s" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                                                   rng.randint(0, 59), rng.randint(0, 59), rng.choice(["Z", ".%03dZ" % rng.randint(0, 999), "+01:00"]))
    if name == "TIME":
        return "%02d:%02d" % (rng.randint(7, 22), rng.choice([0, 15, 30, 45, rng.randint(0, 59)]))
    if name == "HMS":
        return "%02d:%02d:%02d" % (rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
    if name == "YEAR":
        return str(rng.choice([2025, 2026, 2027]))
    if name == "MM":
        return "%02d" % rng.randint(1, 12)
    if name == "PRICE":
        return rng.choice(CURRENCY.get(lang, CURRENCY["en"])).format(a=fmt_amount(rng, lang))
    if name == "AMOUNT":
        return "%d.%02d" % (rng.randint(1, 3000), rng.randint(0, 99))
    if name == "PCT":
        v = "%.1f" % rng.uniform(0.1, 99)
        return (v.replace(".", ",") + " %") if lang in COMMA_DEC else v + "%"
    if name == "VER4":
        return ver4(rng)
    if name == "SEMVER":
        return semver(rng)
    if name == "VER":
        return rng.choice(["v" + ver4(rng), ver4(rng), semver(rng), "v" + semver(rng), semver(rng) + "-rc." + str(rng.randint(1, 5)),
                           "%d.%d" % (rng.randint(1, 30), rng.randint(0, 9))])
    if name == "NUM":
        n = int(mods[0]) if mods else 4
        return nzdigits(rng, n)
    if name == "LONGID":
        return nzdigits(rng, rng.choice([8, 9, 9, 10, 11, 12]))
    if name == "ORDER10":
        return "0" + rng.choice("123456789") + digits(rng, 8)
    if name == "ORDER":
        return rng.choice([nzdigits(rng, 8), "ORD-" + digits(rng, 6), "%s-%s-%s" % (digits(rng, 3), digits(rng, 7), digits(rng, 7)),
                           "A" + digits(rng, 9), "#" + nzdigits(rng, 6), "SO" + digits(rng, 7), "0" + digits(rng, 9)])
    if name == "INVOICE":
        y = rng.choice([2025, 2026])
        return rng.choice([f"{y}-{rng.randint(1, 12):02d}-{digits(rng, 6)}", f"RE-{y}-{digits(rng, 5)}", f"INV/{y}/{rng.randint(1, 12):02d}/{digits(rng, 4)}",
                           f"INV-{nzdigits(rng, 7)}", f"F{y}{digits(rng, 6)}", f"{y}{digits(rng, 8)}"])
    if name == "TICKET":
        return rng.choice(["#" + nzdigits(rng, 9), "#" + nzdigits(rng, 6), "INC" + digits(rng, 7), "SUP-" + nzdigits(rng, 5),
                           "JIRA-" + nzdigits(rng, 4), "CS" + digits(rng, 8)])
    if name == "UPS":
        return ups(rng)
    if name == "USPS":
        n = "9400" + digits(rng, 18)
        return " ".join(n[i:i + 4] for i in range(0, 22, 4))
    if name == "DHL":
        return rng.choice(["JJD00" + digits(rng, 17), nzdigits(rng, 10), "00340434" + digits(rng, 12)])
    if name == "BAD16":
        return bad16(rng)
    if name == "BAD16G":
        n = bad16(rng)
        return rng.choice([" ", "-"]).join(n[i:i + 4] for i in range(0, 16, 4))
    if name == "SHORTSHA":
        return rstr(rng, HEX, 7)
    if name == "SHA":
        return rstr(rng, HEX, 40)
    if name == "HEX64":
        return rstr(rng, HEX, 64)
    if name == "HEX16":
        return rstr(rng, HEX, 16)
    if name == "MAC":
        parts = ["%02X" % rng.randint(0, 255) for _ in range(6)]
        return rng.choice([":".join(parts), "-".join(parts), ":".join(parts).lower(),
                           ".".join("".join(parts[i:i + 2]).lower() for i in (0, 2, 4))])
    if name == "ISBN":
        return isbn13(rng)
    if name == "EAN":
        return ean13(rng)
    if name == "UUID":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if name == "SERIAL":
        return rng.choice(["C02" + rstr(rng, string.ascii_uppercase + string.digits, 9), "SN" + digits(rng, 10),
                           f"{rstr(rng, string.ascii_uppercase, 2)}{digits(rng, 2)}-{digits(rng, 5)}-{digits(rng, 4)}",
                           rstr(rng, string.ascii_uppercase + string.digits, 12)])
    if name == "PART":
        return rng.choice([f"{digits(rng, 4)}-{digits(rng, 3)}-{digits(rng, 3)}", f"PN-{digits(rng, 6)}",
                           f"{rstr(rng, string.ascii_uppercase, 3)}-{digits(rng, 4)}-{rstr(rng, string.ascii_uppercase, 1)}",
                           f"{digits(rng, 3)}.{digits(rng, 3)}.{digits(rng, 2)}"])
    if name == "IMGDATE":
        return "2026%02d%02d_%02d%02d%02d" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
    if name == "EPOCH":
        return str(rng.randint(1735000000, 1799999999))
    if name == "EPOCHMS":
        return str(rng.randint(1735000000000, 1799999999999))
    if name == "LAST4":
        return digits(rng, 4)
    if name == "PORT":
        return str(rng.randint(1024, 65535))
    if name == "PID":
        return str(rng.randint(300, 65000))
    if name == "MS":
        return str(rng.randint(2, 4800))
    if name == "BIC":
        return rng.choice(BICS.get(lang, BICS["en"]))
    if name == "CUSTREF":
        return rng.choice(["K-" + digits(rng, 7), "CUST" + digits(rng, 8), digits(rng, 3) + "/" + digits(rng, 5),
                           "KD" + digits(rng, 6)])
    if name == "ROWNUM":
        ctx.row = getattr(ctx, "row", rng.randint(100, 9000)) + rng.randint(1, 7)
        return str(ctx.row)
    if name == "ZIP":
        return digits(rng, 5)
    if name == "VAT":
        return rng.choice(["DE" + nzdigits(rng, 9), "FR" + digits(rng, 11), "ATU" + digits(rng, 8), "IT" + digits(rng, 11),
                           "NL" + digits(rng, 9) + "B0" + str(rng.randint(1, 9)), "ESB" + digits(rng, 8)])
    if name == "KB":
        return str(rng.randint(12, 9800))
    if name == "IPV":  # software version that looks like a dotted quad
        return "%d.%d.%d.%d" % (rng.randint(1, 12), rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 255))
    raise KeyError(name)


# ----------------------------------------------------------------- rendering

PH = re.compile(r"⟦([A-Za-z_0-9]+)(?::([^#⟧]*))?(?:#(\w+))?⟧")


class Ctx:
    def __init__(self, rng, lang):
        self.rng, self.lang = rng, lang
        self.persona = make_persona(rng, lang)
        self.memo = {}
        self.meta = {}


def produce(name, mods, ctx):
    rng, lang = ctx.rng, ctx.lang
    if name == "email":
        return gen_email(rng, mods, lang, ctx.persona)
    if name == "phone":
        return gen_phone(rng, mods, lang, ctx.meta)
    if name == "card":
        return gen_card(rng, mods, lang)
    if name == "iban":
        return gen_iban(rng, mods, lang)
    if name == "ssn":
        return gen_ssn(rng, mods, lang)
    if name == "ip":
        return gen_ip(rng, mods, lang)
    if name == "cred":
        return gen_cred(rng, mods, lang)
    return filler(name, mods, ctx)


def render(tpl, ctx):
    out, labels, pos = [], [], 0
    for m in PH.finditer(tpl):
        out.append(tpl[pos:m.start()])
        pos = m.end()
        name, var, tag = m.group(1), m.group(2) or "", m.group(3)
        mods = [x for x in var.split("+") if x]
        key = (name, tag)
        if tag and key in ctx.memo:
            val = ctx.memo[key]
        else:
            val = produce(name, mods, ctx)
            if tag:
                ctx.memo[key] = val
        out.append(val)
        if name in ENTITY:
            labels.append({"entity": ENTITY[name], "value": val})
    out.append(tpl[pos:])
    return "".join(out), labels


def types_in(tpl):
    return {ENTITY[m.group(1)] for m in PH.finditer(tpl) if m.group(1) in ENTITY}


# ================================================================= templates
# "§" at the start marks a standalone document (not combined with other
# sentences).  {BODY} in a frame is replaced by the composed sentences.

POS = {}
NEG = {}
NEGDOC = {}
FRAMES = {}

POS["en"] = [
    # ---- email
    "You can reach me at ⟦email⟧ if anything changes.",
    "Please send the signed contract to ⟦email⟧ by Friday, not to my personal one.",
    "cc'ing ⟦email⟧ since she owns billing now",
    "Contact: ⟦email:obf⟧ (spelled out so the scrapers don't get it)",
    "my new address is ⟦email⟧ , the old one bounces",
    "EMAIL ME AT ⟦email:upper⟧ ASAP ITS ABOUT THE LEASE",
    "Forwarding this to ⟦email⟧ and ⟦email:role⟧ for review.",
    "Login is ⟦email⟧ (same as on the invoice).",
    "For press enquiries write to ⟦email:obf⟧ or ring the front desk.",
    "hey is ⟦email⟧ still your work email or did you move to the new domain",
    "He signed up twice, once as ⟦email:plain#a⟧ and once as ⟦email:upper⟧; please keep ⟦email#a⟧ and delete the other.",
    "Bounce notice: delivery to <⟦email⟧> failed permanently (550 5.1.1 mailbox unavailable).",
    "Send CVs to ⟦email:fw⟧ — sorry, my IME typed that @ sign.",
    "The address on file is ⟦email:idn⟧, which the old mail server couldn't handle.",
    "Unsubscribe requests go to ⟦email:plus⟧, not to me directly.",
    "[Email us](mailto:⟦email:plain#m⟧) or write to ⟦email#m⟧ directly.",
    "<a href=\"mailto:⟦email:role⟧?subject=Refund\">contact support</a>",
    "please add ⟦email:obf⟧ to the distribution list (thats the format he gave me)",
    "Reply-To: ⟦email⟧",
    "From: \"⟦NAME⟧\" <⟦email:plain⟧>",
    "Her personal address is ⟦email:shy⟧ — the hyphen got in when I copied it from the PDF.",
    # ---- phone
    "Call me on ⟦phone⟧ after 5pm.",
    "Phone no. ⟦phone⟧",
    "Tel: ⟦phone⟧ | Fax: ⟦phone⟧",
    "Best number to reach him is ⟦phone:us+ext⟧ during office hours.",
    "mobile ⟦phone:uk+mob⟧ (whatsapp is fine too)",
    "Customer says their cell is ⟦phone:us⟧ but the CRM still shows ⟦phone:us⟧.",
    "Emergency contact: ⟦RNAME⟧ (sister), ⟦phone⟧",
    "pls text ⟦phone⟧ when ur outside, buzzer is broken",
    "Our Sydney office is on ⟦phone:au⟧ and Melbourne on ⟦phone:au⟧.",
    "If you are calling from abroad, use ⟦phone:uk+land⟧ instead of the freephone line.",
    "Callback requested — ⟦phone⟧ — between 2 and 4 pm only.",
    "his number changed to ⟦phone:de⟧, he's in Berlin until March",
    "Missed call from ⟦phone⟧ at ⟦TIME⟧, no voicemail left.",
    "Reception: ⟦phone:ca+ext⟧",
    "For urgent matters ring ⟦phone:ie⟧ or the duty manager on ⟦phone:ie⟧.",
    "Patient asked us to use ⟦phone:in⟧ for appointment reminders.",
    "CALL BACK NUMBER ⟦phone:us⟧ !!! they said it's urgent",
    "Our Singapore desk: ⟦phone:sg⟧ (GMT+8).",
    "She gave ⟦phone:za⟧ as the contact number for the delivery driver.",
    "Phone (home): ⟦phone⟧ / Phone (work): ⟦phone⟧",
    # ---- card
    "Card number: ⟦card⟧, exp 09/28, the CVV is on the back.",
    "customer read the card out over the phone: ⟦card⟧",
    "Charge failed for card ⟦card⟧ (issuer declined, code 05).",
    "Please refund the Amex, full number ⟦card:amex⟧, not the Visa.",
    "I paid with my Visa ⟦card:visa⟧ but got charged twice for order ⟦ORDER⟧.",
    "card: ⟦card⟧ / name on card: ⟦NAME⟧",
    "can u update my payment method to ⟦card:mc⟧ exp 11/29 thx",
    "The old card ⟦card#o⟧ expired; use ⟦card⟧ from now on and remove ⟦card#o⟧ from the profile.",
    "CARD NO ⟦card⟧ EXP 03/27",
    "Diners Club number for the hotel deposit: ⟦card:diners⟧",
    "Tried the JCB ⟦card:jcb⟧ too, same error.",
    "Discover card ⟦card:disc⟧ was flagged by the fraud filter this morning.",
    "My new Mastercard is ⟦card:mc2⟧, please put the subscription on that one.",
    "The guest left ⟦card:nbsp⟧ as the guarantee for the late arrival.",
    "copy-pasted from the bank app: ⟦card:zwsp⟧",
    "Corporate card (do not share!) ⟦card:thin⟧",
    # ---- iban
    "Please transfer the deposit to IBAN ⟦iban⟧ (BIC ⟦BIC⟧).",
    "Our bank details have changed, the new IBAN is ⟦iban⟧ — please update your records.",
    "refund to ⟦iban⟧ please, account holder ⟦NAME⟧",
    "IBAN:⟦iban:compact⟧",
    "Wire it to ⟦iban:gb⟧, reference ⟦INVOICE⟧.",
    "Payee: ⟦NAME⟧, IBAN ⟦iban⟧, amount ⟦PRICE⟧.",
    "we received the payment from ⟦iban:lowergroup⟧ but the reference was missing",
    "Supplier bank account updated from ⟦iban:gb⟧ to ⟦iban:ie⟧ — verify by phone before paying!",
    "Direct debit mandate: IBAN ⟦iban:nbsp⟧, first collection on ⟦DATE⟧.",
    "The Dutch landlord wants the rent on ⟦iban:nl⟧ every first of the month.",
    # ---- ssn
    "SSN: ⟦ssn⟧",
    "Employee SSN ⟦ssn⟧, start date ⟦DATE⟧.",
    "my social is ⟦ssn⟧ if you need it for the W-9",
    "Name: ⟦NAME⟧ SSN⟦ssn:plain⟧ DOB: see scan",
    "Social Security No.: ⟦ssn:udash⟧",
    "The applicant's social security number is ⟦ssn⟧ and the spouse's is ⟦ssn⟧.",
    "ss# ⟦ssn:space⟧",
    "SSN (from the last form) ⟦ssn:plain⟧ — please double-check, the scan is blurry",
    "taxpayer id: ⟦ssn⟧ (individual SSN, not an EIN)",
    "Dependent: ⟦RNAME⟧, SSN ⟦ssn⟧, relationship: son.",
    "SOCIAL SECURITY NUMBER ⟦ssn⟧",
    "Can you fix the typo in my SSN? It should be ⟦ssn#s⟧, not what's in the portal. Again: ⟦ssn#s⟧.",
    "ssn:⟦ssn:nbsp⟧",
    # ---- ip
    "Login from ⟦ip⟧ at ⟦TIME⟧ UTC was flagged as suspicious.",
    "Can't connect to the DB at ⟦ip:v4priv⟧:5432, connection refused.",
    "curl -v http://⟦ip:v4⟧:8080/healthz returns 503",
    "peer [⟦ip:v6⟧]:443 reset the connection",
    "X-Forwarded-For: ⟦ip:v4⟧, ⟦ip:v4priv⟧",
    "the printer got a new address, it's ⟦ip:v4priv⟧ now",
    "Blocked ⟦ip:v4⟧ and ⟦ip:v4⟧ at the firewall after the brute-force attempt.",
    "ping ⟦ip:v6⟧ works but ssh times out",
    "Your public IP is ⟦ip:v4⟧ according to the router page.",
    "The VPN hands out ⟦ip:v4priv⟧ to my laptop but the gateway is ⟦ip:v4priv⟧.",
    "Someone from ⟦ip⟧ tried to reset the admin password 40 times.",
    "Allowlist ⟦ip:v4doc⟧ and ⟦ip:v6⟧ for the partner API, please.",
    "link-local address ⟦ip:v6ll⟧ shows up on eth0 but no global one",
    "nslookup says the mail server resolves to ⟦ip:v4⟧",
    # ---- credentials
    "export OPENAI_API_KEY=⟦cred:openai⟧",
    "Authorization: Bearer ⟦cred:jwt⟧",
    "password: ⟦cred:pw⟧",
    "DATABASE_URL=⟦cred:dburl⟧",
    "oops I pasted my token in the public channel: ⟦cred:ghp⟧ — revoking it now",
    "the wifi password is ⟦cred:pw⟧ btw, guest network is open",
    "new hire creds — user: ⟦FIRSTLOWER⟧ / pass: ⟦cred:pw⟧",
    "STRIPE_SECRET_KEY=⟦cred:stripe⟧",
    "GITLAB_TOKEN: ⟦cred:glpat⟧",
    "slack bot token is ⟦cred:slack⟧ (don't commit it)",
    "const apiKey = \"⟦cred:google⟧\";",
    "SENDGRID_API_KEY='⟦cred:sendgrid⟧'",
    "Twilio API key ⟦cred:twilio⟧, secret ⟦cred:hex32⟧",
    "//registry.npmjs.org/:_authToken=⟦cred:npm⟧",
    "HF_TOKEN=⟦cred:hf⟧ python train.py --epochs 3",
    "x-api-key: ⟦cred:anthropic⟧",
    "The mongo string is ⟦cred:dburl_at⟧ and yes, the password has an @ in it, that's why the driver chokes.",
    "Your temporary password is ⟦cred:pw⟧ and expires in 24 hours.",
    "Restricted key for the reporting job: ⟦cred:stripe_rk⟧",
    "use token ⟦cred:github_pat⟧ for the CI job, it has repo scope only",
    "PASSWORD IS ⟦cred:pw⟧ DONT SHARE",
    "Authorization: Bearer ⟦cred:bearer⟧",
    "git clone ⟦cred:giturl⟧",
    "ANTHROPIC_API_KEY=⟦cred:anthropic⟧",
    "my old key ⟦cred:openai_legacy⟧ stopped working, is it revoked?",
    "set the user token to ⟦cred:slackp⟧ in the bot config",
    "admin/⟦cred:pw⟧ works on the staging box",
    # ---- standalone documents
    "§--\n⟦NAME⟧\nSenior Account Manager | ⟦COMPANY⟧\n⟦ADDRESS⟧\nT: ⟦phone⟧\nM: ⟦phone⟧\nE: ⟦email:plain⟧",
    "§Best regards,\n\n⟦NAME⟧\nHead of Operations\nDirect: ⟦phone:uk+land⟧ | Mobile: ⟦phone:uk+mob⟧\n⟦email⟧\nThis e-mail and any attachments are confidential.",
    "§id,name,email,phone,signup_date\n⟦ROWNUM⟧,⟦NAME⟧,⟦email:plain⟧,⟦phone:us⟧,⟦ISODATE⟧⟦P⟧\n⟦ROWNUM⟧,⟦NAME⟧,⟦email:plain⟧,⟦phone:us⟧,⟦ISODATE⟧⟦P⟧\n⟦ROWNUM⟧,⟦NAME⟧,⟦email:plain⟧,,⟦ISODATE⟧",
    "§{\"customer\": {\"name\": \"⟦NAME⟧\", \"email\": \"⟦email:plain⟧\", \"phone\": \"⟦phone⟧\", \"card_last4\": \"⟦LAST4⟧\"}, \"client_ip\": \"⟦ip⟧\", \"order_id\": \"⟦ORDER⟧\", \"ua\": \"Mozilla/5.0 (Windows NT 10.0; Win64; x64)\"}",
    "§⟦ip:v4#a⟧ - - [05/Nov/2026:10:14:22 +0000] \"GET /login HTTP/1.1\" 200 5120 \"-\" \"curl/8.5.0\"\n⟦ip:v4#a⟧ - - [05/Nov/2026:10:14:23 +0000] \"POST /login HTTP/1.1\" 401 312 \"-\" \"curl/8.5.0\"\n⟦ip:v6#b⟧ - - [05/Nov/2026:10:14:25 +0000] \"GET /static/app.v10.2.3.4.js HTTP/2.0\" 304 0 \"-\" \"Mozilla/5.0\"",
    "§Nov  5 03:12:44 bastion sshd[⟦PID⟧]: Failed password for invalid user admin from ⟦ip:v4#x⟧ port ⟦PORT⟧ ssh2\nNov  5 03:12:47 bastion sshd[⟦PID⟧]: Failed password for invalid user oracle from ⟦ip:v4#x⟧ port ⟦PORT⟧ ssh2\nNov  5 03:12:51 bastion sshd[⟦PID⟧]: Connection closed by authenticating user root ⟦ip:v4⟧ port ⟦PORT⟧ [preauth]\nNov  5 03:13:02 bastion sshd[⟦PID⟧]: Accepted publickey for deploy from ⟦ip:v6⟧ port ⟦PORT⟧ ssh2: ED25519 SHA256:⟦HEX16⟧",
    "§Traceback (most recent call last):\n  File \"/srv/app/db.py\", line 42, in connect\n    engine = create_engine(url)\n  File \"/usr/lib/python3.11/site-packages/sqlalchemy/engine/create.py\", line 548, in create_engine\n    u = _url.make_url(url)\nsqlalchemy.exc.ArgumentError: Could not parse SQLAlchemy URL from string '⟦cred:dburl_at⟧'",
    "§APP_ENV=production\nAPP_DEBUG=false\nLOG_LEVEL=info\nDB_HOST=db.internal\nDB_USER=app\nDB_PASSWORD=⟦cred:pw⟧\nREDIS_URL=⟦cred:dburl⟧\nSTRIPE_KEY=⟦cred:stripe⟧\nFEATURE_FLAGS=checkout_v2,new_search",
    "§Hi, here's the deploy key from the old box, can you add it to the new runner?\n\n⟦cred:pem_openssh⟧\n\nThanks!",
    "§$ cat ~/.ssh/id_ed25519\n⟦cred:pem_openssh_split⟧\n$ ",
    "§apiVersion: v1\nkind: Secret\nmetadata:\n  name: db-creds\n  namespace: shop\ntype: Opaque\nstringData:\n  username: app\n  password: \"⟦cred:pw⟧\"\n  url: ⟦cred:dburl⟧",
    "§Application form\nFull name: ⟦NAME⟧\nSSN: ⟦ssn⟧\nPhone: ⟦phone:us⟧\nEmail: ⟦email⟧\nEmployer: ⟦COMPANY⟧\nRouting no.: 0⟦NUM:8⟧ (bank)",
    "§⟦TS⟧ INFO payment.attempt order=⟦ORDER⟧ pan=⟦card:plain⟧ amount=⟦AMOUNT⟧ currency=USD ip=⟦ip:v4⟧ attempt=2",
    "§curl https://api.openai.com/v1/chat/completions \\\n  -H \"Content-Type: application/json\" \\\n  -H \"Authorization: Bearer ⟦cred:openai⟧\" \\\n  -d '{\"model\": \"gpt-4o-mini\", \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}'",
    "§curl https://api.anthropic.com/v1/messages \\\n  --header \"x-api-key: ⟦cred:anthropic⟧\" \\\n  --header \"anthropic-version: 2023-06-01\" \\\n  --header \"content-type: application/json\" \\\n  --data '{\"model\": \"claude-sonnet-4-5\", \"max_tokens\": 256, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'",
    "§[default]\naws_access_key_id = ⟦cred:aws_id⟧\naws_secret_access_key = ⟦cred:aws_secret⟧\nregion = eu-central-1",
    "§[distutils]\nindex-servers =\n    pypi\n\n[pypi]\n  username = __token__\n  password = ⟦cred:pypi⟧",
    "§Employee onboarding – ⟦NAME⟧\nStart: ⟦DATE⟧\nSSN: ⟦ssn⟧\nDirect deposit IBAN (EU payroll): ⟦iban⟧\nCompany card: ⟦card⟧\nLaptop asset tag: ⟦SERIAL⟧",
    "§Please find my details for the refund below:\nName: ⟦NAME⟧\nCard used: ⟦card⟧\nEmail: ⟦email⟧\nPhone: ⟦phone⟧\nOrder: ⟦ORDER⟧ (placed ⟦DATE⟧)\nThanks in advance!",
    "§2026-11-05 10:14:22,481 WARN  [auth] login failed user=⟦email:plain⟧ ip=⟦ip⟧ reason=bad_password\n2026-11-05 10:14:29,007 WARN  [auth] login failed user=⟦email:plain⟧ ip=⟦ip⟧ reason=bad_password\n2026-11-05 10:14:35,913 INFO  [auth] account locked user=⟦email:plain⟧ after 5 attempts",
    "§Ticket ⟦TICKET⟧ — customer called in.\n> Hi, I can't log in. My email is ⟦email⟧ and the phone on the account is ⟦phone⟧. I tried resetting from ⟦ip:v4⟧ but the link never arrived.\nAgent note: verified identity with last 4 of card, reset sent.",
    "§Hey team,\n\nquick heads-up: I accidentally committed our Slack webhook and a bot token to the public repo (commit ⟦SHORTSHA⟧). The token was ⟦cred:slack⟧ and I have already rotated it, but please double check nothing else leaked. The AWS key in the same file (⟦cred:aws_id⟧) was a read-only one; revoked as well.\n\nSorry!\n⟦FIRST⟧",
    "§-----Original Message-----\nFrom: ⟦NAME⟧ <⟦email:plain⟧>\nSent: ⟦DATE⟧ ⟦TIME⟧\nTo: ⟦email:role⟧\nSubject: RE: invoice ⟦INVOICE⟧\n\nHi,\nwe paid invoice ⟦INVOICE⟧ on ⟦DATE⟧ from our account ⟦iban⟧. Please check again and call me on ⟦phone⟧ if it still shows as open.\n\nRegards\n⟦FIRST⟧",
    "§Here is the service account key, paste it into the vault and delete this message:\n⟦cred:pem_rsa⟧",
    "§server.key (generated for the staging LB):\n\n⟦cred:pem_ec⟧\n\nfingerprint SHA256:⟦HEX16⟧",
    "§# .npmrc\nregistry=https://registry.npmjs.org/\n//registry.npmjs.org/:_authToken=⟦cred:npm⟧\nsave-exact=true",
    "§[2026-11-05 09:12:01] <⟦FIRSTLOWER⟧> anyone have the staging db creds?\n[2026-11-05 09:12:40] <ops-bot> ⟦cred:dburl⟧\n[2026-11-05 09:13:02] <⟦FIRSTLOWER⟧> thx",
    "§wire transfer details\n----------------------\nBeneficiary: ⟦COMPANY⟧\nIBAN: ⟦iban⟧\nBIC: ⟦BIC⟧\nReference: ⟦INVOICE⟧\nAmount: ⟦PRICE⟧\nQuestions: ⟦email:role⟧ / ⟦phone⟧",
    "§CONFIDENTIAL - W-4 worksheet\nEmployee: ⟦NAME⟧\nSocial security number: ⟦ssn⟧\nFiling status: single\nHome phone: ⟦phone:us⟧",
    "§HTTP/1.1 200 OK\nContent-Type: application/json\n\n{\"access_token\": \"⟦cred:jwt⟧\", \"token_type\": \"Bearer\", \"expires_in\": 3600, \"refresh_token\": \"⟦cred:bearer⟧\"}",
    "§firewall drop log:\nDROP IN=eth0 OUT= SRC=⟦ip:v4⟧ DST=⟦ip:v4priv#d⟧ LEN=60 PROTO=TCP SPT=⟦PORT⟧ DPT=22\nDROP IN=eth0 OUT= SRC=⟦ip:v4⟧ DST=⟦ip:v4priv#d⟧ LEN=60 PROTO=TCP SPT=⟦PORT⟧ DPT=3389\nDROP IN=eth0 OUT= SRC=⟦ip:v6⟧ DST=⟦ip:v6#e⟧ LEN=80 PROTO=TCP SPT=⟦PORT⟧ DPT=443",
]


NEG["en"] = [
    "We shipped version ⟦VER4⟧ last night; please upgrade before Friday.",
    "The crash dump is attached as crash-⟦LONGID⟧.txt.",
    "Logs for that day are under /var/log/app/⟦YEAR⟧/⟦MM⟧/⟦LONGID⟧.log if you want to dig in.",
    "Order no. ⟦ORDER10⟧ was shipped on ⟦DATE⟧.",
    "Invoice ⟦INVOICE⟧ is overdue by 14 days, total ⟦PRICE⟧.",
    "Ticket ⟦TICKET⟧ has been escalated to tier 2.",
    "Your package is on its way, tracking number ⟦UPS⟧.",
    "See https://shop.example.com/orders/⟦BAD16⟧ for the details.",
    "Build ⟦SHORTSHA⟧ broke the nightly; the full hash is ⟦SHA⟧.",
    "Device MAC ⟦MAC⟧ keeps dropping off the network.",
    "ISBN ⟦ISBN⟧, 2nd edition, paperback.",
    "The meeting moved to ⟦DATE⟧ at ⟦TIME⟧, room 4.12.",
    "Conversion went from ⟦PCT⟧ to ⟦PCT⟧ after the redesign.",
    "Replace YOUR_API_KEY in the snippet with the key from your dashboard.",
    "The docs use sk-xxxx as a placeholder; never paste a real key into the issue tracker.",
    "@channel standup is moved to 10:15 today",
    "meet at noon at the usual place?",
    "Use decorators like @property and @staticmethod instead of writing getters.",
    "Request id ⟦UUID⟧ — please quote it when you contact support.",
    "Serial number ⟦SERIAL⟧, purchased ⟦DATE⟧, still under warranty.",
    "Part no. ⟦PART⟧ is back in stock.",
    "Run npm install lodash@⟦SEMVER⟧ to pin the version.",
    "The password must be at least 12 characters long and contain a digit.",
    "Password: ******** (hidden, ask IT if you forgot it)",
    "Your card ending in ⟦LAST4⟧ will be charged ⟦PRICE⟧ on ⟦DATE⟧.",
    "SSN on file: ***-**-⟦LAST4⟧",
    "Connect with psql postgres://app@db.internal:5432/app and it will prompt for the password.",
    "Put DB_PASSWORD=${DB_PASSWORD} in the compose file; the value comes from the vault.",
    "The firmware changelog lists ⟦IPV⟧ and ⟦IPV⟧ as hotfix releases.",
    "OID 1.3.6.1.4.1.⟦NUM:5⟧ identifies our SNMP enterprise.",
    "std::vector<int>::iterator and std::map::find are both fine here.",
    "The photo IMG_⟦IMGDATE⟧.jpg is too large to attach.",
    "Timestamp ⟦EPOCH⟧ is in seconds, not milliseconds.",
    "GTIN ⟦EAN⟧ is printed under the barcode.",
    "Total: ⟦PRICE⟧ incl. VAT, ⟦PCT⟧ discount applied.",
    "Case number 2026-CV-⟦NUM:5⟧ is scheduled for ⟦DATE⟧.",
    "Flight BA ⟦NUM:4⟧ leaves at ⟦TIME⟧ from gate B32.",
    "Please quote customer reference ⟦CUSTREF⟧ in all correspondence.",
    "The image digest is sha256:⟦HEX64⟧.",
    "ghp_ tokens are rotated automatically every 30 days, see the runbook.",
    "Set the Authorization: Bearer <token> header on every request.",
    "Format: postgres://USER:PASSWORD@HOST:PORT/DBNAME (see the wiki).",
    "Kernel ⟦IPV⟧ ships with the fix, older ones do not.",
    "Version ⟦VER4⟧ is incompatible with Python 3.11.7.",
    "Deploy to node-⟦NUM:3⟧.cluster.local failed at step 4/7.",
    "The release/v⟦VER4⟧ branch was cut from main at ⟦SHORTSHA⟧.",
    "Temperature sensor reports 21.5°C and humidity 40.2%.",
    "The 12:30:45 train was cancelled again, I'll be late.",
    "Your USPS package ⟦USPS⟧ is out for delivery.",
    "Q3 revenue grew ⟦PCT⟧ to ⟦PRICE⟧ million.",
    "Attach the report as report_⟦ISODATE⟧_0930.pdf please.",
    "Sent from my iPhone",
    "The API key field is empty — did you forget to set OPENAI_API_KEY?",
    "Your verification code expires in 10 minutes.",
    "We moved the office to floor 12, desk 12-045.",
    "Please avoid using @here for non-urgent things.",
    "Epoch millis ⟦EPOCHMS⟧ converts to a date in ⟦YEAR⟧.",
    "the token endpoint returned 401 again, maybe the clock is off",
    "Section 4.2.1.3 of the contract covers the termination fee.",
    "The coordinates are 51.5007, -0.1246 if you need them for the drone permit.",
    "Quote #⟦NUM:6⟧ is valid for 30 days.",
    "Warehouse bin A-⟦NUM:3⟧-⟦NUM:2⟧ is empty.",
    "PIN reminders are never sent by email.",
    "Room rate ⟦PRICE⟧ per night, breakfast included.",
    "we're at 99.95% uptime this quarter",
    "your account number is the 8-digit number at the top of the bill, not the meter id",
    "Rotate the keys every 90 days; the next rotation is on ⟦DATE⟧.",
    "The license key goes in ~/.config/app/license (not the API key!).",
    "I'll be at the office at 9, we can meet at the café afterwards.",
    "The CSV has ⟦NUM:5⟧ rows and ⟦NUM:2⟧ columns after cleanup.",
    "The docker tag is ⟦VER4⟧-alpine, not latest.",
    "Barcode 0⟦NUM:11⟧ scanned twice at till 3.",
    "firmware_⟦IPV⟧_release.bin failed the checksum",
    "Use Ctrl+Shift+P and type 'reload window'.",
]

NEGDOC["en"] = [
    "§2026-11-05T10:14:22.481Z INFO  request_id=⟦UUID⟧ method=GET path=/api/v2/orders/⟦LONGID⟧ status=200 duration_ms=⟦MS⟧\n2026-11-05T10:14:22.913Z INFO  request_id=⟦UUID⟧ method=POST path=/api/v2/cart status=201 duration_ms=⟦MS⟧\n2026-11-05T10:14:23.002Z WARN  request_id=⟦UUID⟧ slow query (⟦MS⟧ ms) table=orders rows=⟦NUM:5⟧\n2026-11-05T10:14:23.450Z INFO  app_version=⟦VER4⟧ build=⟦SHORTSHA⟧ worker=⟦PID⟧",
    "§Exception in thread \"main\" java.lang.NullPointerException: Cannot invoke \"String.length()\" because \"name\" is null\n\tat com.example.shop.OrderService.validate(OrderService.java:142)\n\tat com.example.shop.OrderService.place(OrderService.java:88)\n\tat com.example.shop.Main.main(Main.java:21)\nCaused by: order 4111-1111-1111-1112 rejected (id ⟦LONGID⟧)",
    "§sku,name,ean,price,stock\n⟦PART⟧,USB-C cable 2m,⟦EAN⟧,⟦AMOUNT⟧,⟦NUM:3⟧\n⟦PART⟧,Wall charger 65W,⟦EAN⟧,⟦AMOUNT⟧,⟦NUM:2⟧\n⟦PART⟧,Laptop stand,⟦EAN⟧,⟦AMOUNT⟧,⟦NUM:3⟧",
    "§{\n  \"api_key\": \"YOUR_API_KEY\",\n  \"endpoint\": \"https://api.example.com/v2\",\n  \"timeout_ms\": 30000,\n  \"retries\": 3,\n  \"client_version\": \"⟦VER4⟧\",\n  \"password\": \"<set via env>\"\n}",
    "§\"node_modules/lodash\": {\n  \"version\": \"4.17.21\",\n  \"resolved\": \"https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz\",\n  \"integrity\": \"sha512-v2kDEe57lecTulaDIuNTPy3Ry4gLGJ6Z1O3vE1krgXZNrsQ+LFTGHVxVjcXPs17LhbZVGedAJv8XZ1tvj5FvSg==\",\n  \"license\": \"MIT\"\n}",
    "§commit ⟦SHA⟧\nAuthor: build-bot\nDate:   Thu Nov 5 10:14:22 2026 +0100\n\n    Bump version to ⟦VER4⟧\n\ncommit ⟦SHA⟧\nAuthor: release-bot\nDate:   Wed Nov 4 18:02:11 2026 +0100\n\n    Fix flaky test for order ⟦ORDER10⟧",
    "§## [⟦VER4⟧] - 2026-11-05\n### Fixed\n- Crash when the cart contains more than 99 items (#⟦NUM:4⟧)\n- Wrong rounding of 19.99 * 3\n### Changed\n- Minimum supported version is now ⟦VER4⟧",
    "§Setup\n-----\n1. Copy .env.example to .env\n2. Set OPENAI_API_KEY=sk-... and AWS_ACCESS_KEY_ID=<your-access-key-id>\n3. Run `make dev` and open http://localhost:3000\n\nNever commit the .env file. Ask in #platform if you need a key.",
    "§server {\n    listen 443 ssl http2;\n    server_name shop.example.com;\n    ssl_certificate     /etc/ssl/certs/shop.example.com.pem;\n    ssl_certificate_key /etc/ssl/private/shop.example.com.key;\n    location /api/ { proxy_pass http://backend; proxy_read_timeout 60s; }\n}",
    "§class Order:\n    @property\n    def total(self) -> Decimal:\n        return sum(i.price * i.qty for i in self.items)\n\n    @staticmethod\n    def from_row(row):  # row id like 783895424\n        return Order(id=row[0], created=row[1])",
    "§Hi Sam,\n\nthanks for your order ⟦ORDER⟧ placed on ⟦DATE⟧. Your items will ship from our warehouse within 2–3 business days. The invoice number is ⟦INVOICE⟧ and the total was ⟦PRICE⟧ including shipping. Tracking will be ⟦UPS⟧ once the label is printed.\n\nIf you need to change anything, just reply to this message and quote ticket ⟦TICKET⟧. Please do not send card details by email; our agents will never ask for your password.\n\nKind regards,\nCustomer Care",
    "§-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE⟦HEX16⟧q7dCmZ0r2y9n3cXn0GqZk0p\nYQk4cL0Jp7Gf4sW3rO8tBv5aN9qU2xE1mD6hF+Kj8iL0oP4uR7sT3vW9yZ2aBc==\n-----END PUBLIC KEY-----\nThis is the public half; the private key stays on the HSM.",
    "§ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI⟦HEX16⟧Xk2vQ9mP0rL7tZ3wY8uN5bC1dE6fG4hJ deploy@ci-runner-03\n(public key only — add it to authorized_keys on the new box)",
    "§Nov  5 09:00:01 web01 CRON[⟦PID⟧]: (root) CMD (/usr/local/bin/backup.sh --keep 14)\nNov  5 09:00:03 web01 backup.sh[⟦PID⟧]: wrote /backups/2026/11/05/db-⟦LONGID⟧.sql.gz (⟦KB⟧ KB)\nNov  5 09:00:04 web01 systemd[1]: Started Daily cleanup of temporary directories.\nNov  5 09:00:05 web01 kernel: eth0: link up, 1000 Mbps, full duplex, MAC ⟦MAC⟧",
    "§Release notes ⟦VER4⟧\n\n* Upgrade OpenSSL to 3.0.15\n* Fix memory leak in the importer (ticket ⟦TICKET⟧)\n* New config option `max_upload_mb` (default 25)\n* Drop support for firmware older than ⟦IPV⟧\n\nChecksums (sha256):\n⟦HEX64⟧  app-⟦VER4⟧-linux-x64.tar.gz\n⟦HEX64⟧  app-⟦VER4⟧-win-x64.zip",
    "§Meeting notes – ⟦DATE⟧\nAttendees: Dev, Ops, Finance\n- Q3 numbers: revenue up ⟦PCT⟧, churn down to ⟦PCT⟧\n- Invoice run ⟦INVOICE⟧ delayed to next week\n- Action: migrate build agents to image ⟦VER4⟧ by ⟦DATE⟧\n- Next meeting at 14:30, room 3.07",
    "§const API_KEY = process.env.API_KEY ?? \"YOUR_API_KEY\";\nconst res = await fetch(`https://api.example.com/v1/items/${id}`, {\n  headers: { Authorization: `Bearer ${API_KEY}` },\n});\nif (!res.ok) throw new Error(`HTTP ${res.status}`);",
]

FRAMES["en"] = [
    "{BODY}",
    "{BODY}",
    "{BODY}",
    "Hi team,\n\n{BODY}\n\nThanks,\n⟦FIRST⟧",
    "Subject: Re: your request ⟦TICKET⟧\n\n{BODY}",
    "[⟦TIME⟧] ⟦FIRSTLOWER⟧: {BODY}",
    "Hello,\n{BODY}\nBest,\n⟦NAME⟧",
    "Note added by agent on ⟦DATE⟧: {BODY}",
    "> {BODY}",
    "Hi ⟦RFIRST⟧ — {BODY} Cheers!",
    "Internal memo\n\n{BODY}\n\n— sent from the ops mailbox",
    "**Update:** {BODY}",
]


POS["de"] = [
    "Sie erreichen mich unter ⟦email⟧.",
    "Bitte schicken Sie die Unterlagen an ⟦email⟧ und nicht mehr an meine alte Adresse.",
    "E-Mail: ⟦email:obf⟧",
    "Meine neue Mailadresse lautet ⟦email:idn⟧ – die alte wird Ende des Monats abgeschaltet.",
    "Antwort bitte an ⟦email:role⟧ (Sekretariat) und in Kopie an ⟦email⟧.",
    "kannst du mir das pdf an ⟦email⟧ schicken? danke!!",
    "Bewerbungen ausschließlich per Mail an ⟦email:obf⟧.",
    "Sie erreichen mich telefonisch unter ⟦phone:de⟧.",
    "Tel.: ⟦phone:de+land⟧, Fax: ⟦phone:de+land⟧",
    "Mobil: ⟦phone:de+mob⟧",
    "Rückruf bitte unter ⟦phone⟧, am besten vormittags.",
    "Handynummer hat sich geändert, neu: ⟦phone:de+mob⟧",
    "Unsere Wiener Filiale erreichen Sie unter ⟦phone:at⟧.",
    "Büro Zürich: ⟦phone:ch⟧",
    "Der Kunde hat zweimal angerufen (⟦phone#k⟧), bitte zurückrufen – Nummer nochmal: ⟦phone#k⟧",
    "Kreditkartennummer: ⟦card⟧, gültig bis 08/27.",
    "Ich habe mit meiner Mastercard ⟦card:mc⟧ bezahlt, aber keine Bestätigung bekommen.",
    "Bitte belasten Sie die Karte ⟦card⟧ mit dem Restbetrag.",
    "Die Visa-Karte ⟦card:visa⟧ wurde gestern gesperrt, bitte nicht mehr belasten.",
    "Bitte überweisen Sie den Betrag auf folgendes Konto: IBAN ⟦iban:de⟧, BIC ⟦BIC⟧.",
    "Meine Bankverbindung hat sich geändert: ⟦iban⟧",
    "Die Erstattung bitte auf ⟦iban:at⟧ (Kontoinhaberin ⟦NAME⟧).",
    "IBAN ⟦iban:ch⟧ – Verwendungszweck: ⟦INVOICE⟧",
    "SEPA-Lastschriftmandat für das Konto ⟦iban:de+compact⟧ erteilt am ⟦DATE⟧.",
    "Kontoverbindung: ⟦iban:de+nbsp⟧ (Sparkasse)",
    "Für die US-Steuererklärung brauche ich noch die SSN: ⟦ssn⟧",
    "Meine amerikanische Sozialversicherungsnummer (SSN) lautet ⟦ssn⟧.",
    "Der Zugriff kam von der IP-Adresse ⟦ip⟧, das war nicht ich.",
    "Der Server ⟦ip:v4priv⟧ antwortet seit heute früh nicht mehr, bitte prüfen.",
    "Anmeldung von ⟦ip⟧ um ⟦TIME⟧ Uhr wurde blockiert.",
    "Die neue Adresse des NAS ist ⟦ip:v4priv⟧, Port 5001.",
    "Das Passwort ist ⟦cred:pw⟧ – bitte nach dem ersten Login ändern.",
    "Passwort: ⟦cred:pw⟧",
    "Zugangsdaten für den Testserver: Benutzer admin, Kennwort ⟦cred:pw⟧",
    "Hier der API-Schlüssel für die Staging-Umgebung: ⟦cred⟧",
    "Token (bitte nicht weitergeben): ⟦cred:ghp⟧",
    "Passwort ist ⟦cred:pw⟧ (mit großem Anfangsbuchstaben)",
    "§Mit freundlichen Grüßen\n\n⟦NAME⟧\nSachbearbeitung Buchhaltung\n⟦COMPANY⟧ · ⟦ADDRESS⟧\nTel. ⟦phone:de+land⟧ | Mobil ⟦phone:de+mob⟧\n⟦email:plain⟧",
    "§Name: ⟦NAME⟧\nTelefon: ⟦phone:de⟧\nE-Mail: ⟦email⟧\nIBAN: ⟦iban:de⟧\nKontoinhaber: ⟦NAME⟧\nUnterschrift: ________",
    "§Hallo zusammen,\n\ndie Zugangsdaten für die neue Datenbank lauten ⟦cred:dburl⟧. Bitte nur im Passwortmanager speichern, nicht im Wiki.\nBei Fragen: ⟦phone:de+mob⟧\n\nViele Grüße\n⟦FIRST⟧",
    "§Kundendaten (Export ⟦DATE⟧)\nKundennr.;Name;E-Mail;Telefon\n⟦CUSTREF⟧;⟦NAME⟧;⟦email:plain⟧;⟦phone:de⟧⟦P⟧\n⟦CUSTREF⟧;⟦NAME⟧;⟦email:plain⟧;⟦phone:de⟧",
    "§Sehr geehrte Damen und Herren,\n\nich widerrufe hiermit das SEPA-Mandat für mein Konto ⟦iban:de⟧. Bitte bestätigen Sie mir den Eingang per E-Mail an ⟦email⟧.\n\nMit freundlichen Grüßen\n⟦NAME⟧",
]

NEG["de"] = [
    "Wir haben gestern Version ⟦VER4⟧ ausgerollt, bitte bis Freitag aktualisieren.",
    "Ihre Bestellnummer ⟦ORDER10⟧ wurde am ⟦DATE⟧ versandt.",
    "Rechnungsnummer ⟦INVOICE⟧, Betrag ⟦PRICE⟧, fällig in 14 Tagen.",
    "Die Sendungsnummer lautet ⟦DHL⟧.",
    "Ticket ⟦TICKET⟧ wurde an den Second-Level-Support weitergeleitet.",
    "Das Foto IMG_⟦IMGDATE⟧.jpg ist leider zu groß für den Anhang.",
    "Aktenzeichen 3 O ⟦NUM:3⟧/26 – Termin am ⟦DATE⟧ um ⟦TIME⟧ Uhr.",
    "Kundennummer ⟦CUSTREF⟧ bitte bei Rückfragen angeben.",
    "Der Termin wurde auf ⟦DATE⟧, ⟦TIME⟧ Uhr verschoben, Raum 2.14.",
    "Artikelnummer ⟦PART⟧ ist wieder lieferbar.",
    "Die Seriennummer steht auf dem Typenschild: ⟦SERIAL⟧.",
    "Das Passwort muss mindestens 12 Zeichen lang sein.",
    "Bitte tragen Sie Ihren API-Schlüssel statt DEIN_API_KEY in die Konfiguration ein.",
    "Treffen wir uns um 12 Uhr at the usual place? Also am Brunnen.",
    "Die Umsatzsteuer-ID lautet ⟦VAT⟧.",
    "Die Firmware ⟦IPV⟧ behebt den Fehler beim Neustart.",
    "Rabatt von ⟦PCT⟧ wurde bereits abgezogen, Gesamtsumme ⟦PRICE⟧.",
    "Karte endet auf ⟦LAST4⟧, Abbuchung am ⟦DATE⟧.",
    "Die Datei liegt unter /daten/scans/⟦YEAR⟧/⟦LONGID⟧.pdf.",
    "Vorgangsnummer ⟦NUM:4⟧-⟦YEAR⟧-⟦NUM:6⟧ bitte immer angeben.",
    "ISBN ⟦ISBN⟧, 3. Auflage.",
    "IBAN bitte im Format DEkk bbbb bbbb cccc cccc cc angeben, ohne Leerzeichen am Ende.",
]

NEGDOC["de"] = [
    "§Hallo Frau Weber,\n\nvielen Dank für Ihre Bestellung ⟦ORDER⟧ vom ⟦DATE⟧. Die Lieferung erfolgt in zwei Paketen, die Sendungsnummern sind ⟦DHL⟧ und ⟦DHL⟧. Die Rechnung ⟦INVOICE⟧ über ⟦PRICE⟧ liegt bei.\n\nBitte senden Sie uns keine Kartendaten per E-Mail.\n\nIhr Kundenservice",
    "§Protokoll der Sitzung vom ⟦DATE⟧\nTOP 1: Umstellung auf Version ⟦VER4⟧\nTOP 2: Budget ⟦YEAR⟧ (+⟦PCT⟧)\nTOP 3: Raumplanung, Raum 4.12 und 4.13\nNächster Termin: ⟦DATE⟧, ⟦TIME⟧ Uhr",
]

FRAMES["de"] = [
    "{BODY}", "{BODY}",
    "Hallo ⟦RFIRST⟧,\n\n{BODY}\n\nViele Grüße\n⟦FIRST⟧",
    "Sehr geehrte Damen und Herren,\n\n{BODY}\n\nMit freundlichen Grüßen\n⟦NAME⟧",
    "Betreff: Ihre Anfrage ⟦TICKET⟧\n\n{BODY}",
    "[⟦TIME⟧] ⟦FIRST⟧: {BODY}",
    "Notiz vom ⟦DATE⟧: {BODY}",
]

POS["fr"] = [
    "Vous pouvez me joindre à l'adresse ⟦email⟧.",
    "Merci d'envoyer le dossier complet à ⟦email⟧ avant vendredi.",
    "Courriel : ⟦email:obf⟧",
    "Ma nouvelle adresse est ⟦email:idn⟧, l'ancienne ne fonctionne plus.",
    "Pour toute question, écrivez à ⟦email:role⟧.",
    "Vous pouvez me joindre au ⟦phone:fr⟧.",
    "Tél. : ⟦phone⟧ – Portable : ⟦phone:fr⟧",
    "Rappelez-moi au ⟦phone⟧ s'il vous plaît, je suis dispo après 18h.",
    "Le numéro du cabinet à Bruxelles est le ⟦phone:be⟧.",
    "Standard de Genève : ⟦phone:ch⟧",
    "Numéro de carte : ⟦card⟧, date d'expiration 10/28.",
    "J'ai payé avec ma carte ⟦card⟧ mais la commande n'apparaît pas.",
    "Merci de débiter la carte bancaire ⟦card:visa⟧ pour le solde.",
    "Voici mon RIB : IBAN ⟦iban:fr⟧, BIC ⟦BIC⟧.",
    "Merci de rembourser sur le compte ⟦iban⟧ au nom de ⟦NAME⟧.",
    "IBAN du syndic : ⟦iban:fr+compact⟧",
    "Nouvelles coordonnées bancaires : ⟦iban:be⟧ (à partir du ⟦DATE⟧).",
    "Pour mon dossier fiscal américain, mon SSN est ⟦ssn⟧.",
    "Connexion suspecte depuis l'adresse IP ⟦ip⟧ à ⟦TIME⟧.",
    "Le serveur ⟦ip:v4priv⟧ ne répond plus depuis ce matin.",
    "L'adresse IPv6 du routeur est ⟦ip:v6⟧, l'IPv4 publique ⟦ip:v4⟧.",
    "mot de passe : ⟦cred:pw⟧",
    "Le mot de passe du wifi est ⟦cred:pw⟧ (attention aux majuscules)",
    "Identifiant : admin / mot de passe : ⟦cred:pw⟧",
    "Voici la clé API de test : ⟦cred⟧ – ne la mettez pas dans Git.",
    "§Cordialement,\n\n⟦NAME⟧\nResponsable administrative\n⟦COMPANY⟧ – ⟦ADDRESS⟧\nTél. ⟦phone:fr⟧ | ⟦email:plain⟧",
    "§Nom : ⟦NAME⟧\nTéléphone : ⟦phone:fr⟧\nCourriel : ⟦email⟧\nIBAN : ⟦iban:fr⟧\nCarte : ⟦card⟧",
    "§Bonjour,\n\nsuite à notre appel, je vous confirme mes coordonnées : ⟦email⟧ et ⟦phone⟧. Le virement partira du compte ⟦iban⟧ dès réception de la facture ⟦INVOICE⟧.\n\nBien à vous,\n⟦NAME⟧",
]

NEG["fr"] = [
    "La version ⟦VER4⟧ corrige le problème d'impression.",
    "Votre commande n° ⟦ORDER10⟧ a été expédiée le ⟦DATE⟧.",
    "Facture ⟦INVOICE⟧ d'un montant de ⟦PRICE⟧, à régler sous 30 jours.",
    "Numéro de suivi Colissimo : 6A⟦NUM:11⟧.",
    "Le ticket ⟦TICKET⟧ a été transmis au service technique.",
    "Rendez-vous le ⟦DATE⟧ à ⟦TIME⟧, salle 3.02.",
    "Référence client ⟦CUSTREF⟧, à rappeler dans toute correspondance.",
    "Le mot de passe doit contenir au moins 12 caractères.",
    "Remplacez VOTRE_CLE_API par votre propre clé.",
    "Le numéro de TVA intracommunautaire est ⟦VAT⟧.",
    "La photo IMG_⟦IMGDATE⟧.jpg est en pièce jointe.",
    "Remise de ⟦PCT⟧ appliquée, total ⟦PRICE⟧ TTC.",
    "SIRET 552 100 554 00025, code APE 6201Z.",
    "Le fichier est dans /srv/exports/⟦YEAR⟧/⟦LONGID⟧.csv.",
]

FRAMES["fr"] = [
    "{BODY}", "{BODY}",
    "Bonjour ⟦RFIRST⟧,\n\n{BODY}\n\nCordialement,\n⟦NAME⟧",
    "Madame, Monsieur,\n\n{BODY}\n\nBien cordialement,\n⟦NAME⟧",
    "Objet : demande ⟦TICKET⟧\n\n{BODY}",
    "[⟦TIME⟧] ⟦FIRST⟧ : {BODY}",
]

POS["es"] = [
    "Puedes escribirme a ⟦email⟧ cuando quieras.",
    "Por favor, envíe la documentación a ⟦email⟧ antes del viernes.",
    "Correo: ⟦email:obf⟧",
    "Mi nuevo correo es ⟦email:idn⟧, el antiguo ya no funciona.",
    "Para reservas escriba a ⟦email:role⟧.",
    "Mi móvil es el ⟦phone:es⟧, llámame por la tarde.",
    "Tel.: ⟦phone⟧ / Fax: ⟦phone:es⟧",
    "Llámenos al ⟦phone⟧ de lunes a viernes.",
    "Oficina de Ciudad de México: ⟦phone:mx⟧",
    "Número de tarjeta: ⟦card⟧, caduca 07/29.",
    "Pagué con la tarjeta ⟦card⟧ pero el cargo salió dos veces.",
    "Tarjeta Visa ⟦card:visa⟧ a nombre de ⟦NAME⟧.",
    "Por favor, haga la transferencia a la cuenta IBAN ⟦iban:es⟧.",
    "Mi número de cuenta es ⟦iban⟧, titular ⟦NAME⟧.",
    "IBAN para la devolución: ⟦iban:es+compact⟧",
    "Número de Seguro Social (SSN): ⟦ssn⟧",
    "Mi número de seguro social en EE. UU. es ⟦ssn⟧, lo necesito para el formulario W-2.",
    "El SSN del solicitante es ⟦ssn:udash⟧ y el de su cónyuge ⟦ssn⟧.",
    "Hubo un acceso desde la IP ⟦ip⟧ que no reconozco.",
    "El servidor ⟦ip:v4priv⟧ no responde desde anoche.",
    "contraseña: ⟦cred:pw⟧",
    "La contraseña del wifi es ⟦cred:pw⟧ (todo junto)",
    "Usuario: admin – Contraseña: ⟦cred:pw⟧",
    "Te paso la clave de la API de pruebas: ⟦cred⟧",
    "§Un saludo,\n\n⟦NAME⟧\nDepartamento de Administración\n⟦COMPANY⟧ · ⟦ADDRESS⟧\nTel. ⟦phone:es⟧ · ⟦email:plain⟧",
    "§Nombre: ⟦NAME⟧\nTeléfono: ⟦phone⟧\nCorreo electrónico: ⟦email⟧\nIBAN: ⟦iban:es⟧\nSSN (solo empleados en EE. UU.): ⟦ssn⟧",
    "§Hola,\n\nme han cobrado dos veces el pedido ⟦ORDER⟧ con la tarjeta ⟦card⟧. Pueden devolverme el importe a la cuenta ⟦iban:es⟧ o llamarme al ⟦phone:es⟧.\n\nGracias,\n⟦FIRST⟧",
]

NEG["es"] = [
    "Hemos publicado la versión ⟦VER4⟧ con varias correcciones.",
    "Su pedido n.º ⟦ORDER10⟧ salió del almacén el ⟦DATE⟧.",
    "Factura ⟦INVOICE⟧ por importe de ⟦PRICE⟧.",
    "El número de seguimiento es ⟦UPS⟧.",
    "La incidencia ⟦TICKET⟧ está en revisión.",
    "Nos vemos el ⟦DATE⟧ a las ⟦TIME⟧ en la sala 2.05.",
    "La contraseña debe tener al menos 10 caracteres.",
    "Sustituya TU_CLAVE_API por la clave de su panel.",
    "El NIF de la empresa es B⟦NUM:8⟧.",
    "Descuento del ⟦PCT⟧ aplicado, total ⟦PRICE⟧.",
    "La foto IMG_⟦IMGDATE⟧.jpg no se puede abrir.",
    "Referencia del cliente: ⟦CUSTREF⟧.",
    "El expediente ⟦YEAR⟧/⟦NUM:6⟧ está pendiente de firma.",
]

FRAMES["es"] = [
    "{BODY}", "{BODY}",
    "Hola ⟦RFIRST⟧:\n\n{BODY}\n\nUn saludo,\n⟦FIRST⟧",
    "Estimados señores:\n\n{BODY}\n\nAtentamente,\n⟦NAME⟧",
    "Asunto: consulta ⟦TICKET⟧\n\n{BODY}",
    "[⟦TIME⟧] ⟦FIRST⟧: {BODY}",
]

POS["it"] = [
    "Potete scrivermi a ⟦email⟧ per qualsiasi domanda.",
    "Inviare i documenti firmati a ⟦email⟧ entro lunedì.",
    "Email: ⟦email:obf⟧",
    "Il mio nuovo indirizzo è ⟦email:idn⟧.",
    "Per l'assistenza scrivete a ⟦email:role⟧.",
    "Il mio cellulare è ⟦phone:it⟧, chiamatemi dopo le 18.",
    "Tel. ⟦phone⟧ – Fax ⟦phone:it⟧",
    "Richiamare il cliente al numero ⟦phone⟧.",
    "Ufficio di Lugano: ⟦phone:ch⟧",
    "Numero carta: ⟦card⟧, scadenza 12/27.",
    "Ho pagato con la carta ⟦card⟧ ma l'ordine risulta non pagato.",
    "Le coordinate bancarie sono: IBAN ⟦iban:it⟧, BIC ⟦BIC⟧.",
    "Effettuare il rimborso sull'IBAN ⟦iban⟧ intestato a ⟦NAME⟧.",
    "IBAN ⟦iban:it+compact⟧ (conto aziendale)",
    "Per la pratica americana mi serve il SSN: ⟦ssn⟧.",
    "Accesso sospetto dall'indirizzo IP ⟦ip⟧ alle ⟦TIME⟧.",
    "Il server ⟦ip:v4priv⟧ non risponde più.",
    "password: ⟦cred:pw⟧",
    "La password del wifi è ⟦cred:pw⟧ (tutto attaccato)",
    "Ecco la chiave API per l'ambiente di test: ⟦cred⟧",
    "§Cordiali saluti,\n\n⟦NAME⟧\nUfficio Amministrazione\n⟦COMPANY⟧ – ⟦ADDRESS⟧\nTel. ⟦phone:it⟧ · Cell. ⟦phone:it⟧\n⟦email:plain⟧",
    "§Nome: ⟦NAME⟧\nTelefono: ⟦phone:it⟧\nEmail: ⟦email⟧\nIBAN: ⟦iban:it⟧",
]

NEG["it"] = [
    "È disponibile la versione ⟦VER4⟧ del gestionale.",
    "L'ordine n. ⟦ORDER10⟧ è stato spedito il ⟦DATE⟧.",
    "Fattura n. ⟦INVOICE⟧, importo ⟦PRICE⟧.",
    "Il codice di tracciamento è ⟦DHL⟧.",
    "Il ticket ⟦TICKET⟧ è stato chiuso.",
    "Riunione il ⟦DATE⟧ alle ⟦TIME⟧, sala 1.08.",
    "La password deve essere lunga almeno 12 caratteri.",
    "Sostituire LA_TUA_CHIAVE_API con la chiave reale.",
    "Partita IVA ⟦VAT⟧.",
    "Sconto del ⟦PCT⟧ già applicato, totale ⟦PRICE⟧.",
    "Il file IMG_⟦IMGDATE⟧.jpg è troppo grande.",
    "Protocollo n. ⟦NUM:6⟧/⟦YEAR⟧ del ⟦DATE⟧.",
]

FRAMES["it"] = [
    "{BODY}", "{BODY}",
    "Ciao ⟦RFIRST⟧,\n\n{BODY}\n\nA presto,\n⟦FIRST⟧",
    "Gentili Signori,\n\n{BODY}\n\nDistinti saluti,\n⟦NAME⟧",
    "Oggetto: richiesta ⟦TICKET⟧\n\n{BODY}",
]

POS["nl"] = [
    "Je kunt me mailen op ⟦email⟧.",
    "Stuur de getekende offerte naar ⟦email⟧ alstublieft.",
    "E-mail: ⟦email:obf⟧",
    "Voor vragen kunt u terecht bij ⟦email:role⟧.",
    "Mijn mobiele nummer is ⟦phone:nl⟧.",
    "Tel. ⟦phone⟧, bereikbaar tussen 9 en 17 uur.",
    "Bel ons kantoor in Antwerpen: ⟦phone:be⟧",
    "Kaartnummer: ⟦card⟧, geldig tot 05/28.",
    "Ik heb betaald met creditcard ⟦card⟧.",
    "Graag overmaken naar ⟦iban:nl⟧ t.n.v. ⟦NAME⟧.",
    "Mijn IBAN is ⟦iban⟧, wil je het bedrag terugstorten?",
    "Rekeningnummer: ⟦iban:nl+compact⟧",
    "Er werd ingelogd vanaf IP-adres ⟦ip⟧, dat was ik niet.",
    "De server ⟦ip:v4priv⟧ reageert niet meer.",
    "wachtwoord: ⟦cred:pw⟧",
    "Het wifi-wachtwoord is ⟦cred:pw⟧ (hoofdlettergevoelig)",
    "Hier is de API-sleutel voor de testomgeving: ⟦cred⟧",
    "Voor mijn Amerikaanse belastingaangifte: SSN ⟦ssn⟧",
    "§Met vriendelijke groet,\n\n⟦NAME⟧\nFinanciële administratie\n⟦COMPANY⟧\nT ⟦phone:nl⟧\nE ⟦email:plain⟧",
    "§Naam: ⟦NAME⟧\nTelefoon: ⟦phone:nl⟧\nE-mail: ⟦email⟧\nIBAN: ⟦iban:nl⟧",
]

NEG["nl"] = [
    "Versie ⟦VER4⟧ staat klaar om te installeren.",
    "Uw bestelling ⟦ORDER10⟧ is op ⟦DATE⟧ verzonden.",
    "Factuur ⟦INVOICE⟧, bedrag ⟦PRICE⟧.",
    "Track & trace: 3S⟦NUM:13⟧.",
    "Ticket ⟦TICKET⟧ is doorgezet naar de tweede lijn.",
    "Afspraak op ⟦DATE⟧ om ⟦TIME⟧ in zaal 1.12.",
    "Het wachtwoord moet minstens 12 tekens bevatten.",
    "Vervang JOUW_API_SLEUTEL door je eigen sleutel.",
    "Btw-nummer ⟦VAT⟧.",
    "Korting van ⟦PCT⟧ is verwerkt.",
    "KvK-nummer ⟦NUM:8⟧, vestigingsnummer 0000⟦NUM:8⟧.",
]

FRAMES["nl"] = [
    "{BODY}", "{BODY}",
    "Hoi ⟦RFIRST⟧,\n\n{BODY}\n\nGroeten,\n⟦FIRST⟧",
    "Geachte heer/mevrouw,\n\n{BODY}\n\nMet vriendelijke groet,\n⟦NAME⟧",
]

POS["pl"] = [
    "Proszę o kontakt mailowy: ⟦email⟧.",
    "Dokumenty proszę przesłać na adres ⟦email⟧.",
    "E-mail: ⟦email:obf⟧",
    "Mój nowy adres to ⟦email:idn⟧.",
    "Mój numer telefonu: ⟦phone:pl⟧.",
    "Tel. ⟦phone⟧, kom. ⟦phone:pl⟧",
    "Proszę oddzwonić pod numer ⟦phone⟧.",
    "Numer karty: ⟦card⟧, ważna do 04/28.",
    "Zapłaciłem kartą ⟦card⟧, ale zamówienie nie jest opłacone.",
    "Proszę o przelew na konto ⟦iban:pl⟧.",
    "Numer rachunku do zwrotu: ⟦iban⟧",
    "IBAN: ⟦iban:pl+compact⟧",
    "Logowanie z adresu IP ⟦ip⟧ zostało zablokowane.",
    "Serwer ⟦ip:v4priv⟧ nie odpowiada od rana.",
    "hasło: ⟦cred:pw⟧",
    "Hasło do wifi to ⟦cred:pw⟧",
    "Klucz API do środowiska testowego: ⟦cred⟧",
    "Mój amerykański numer SSN: ⟦ssn⟧",
    "§Z poważaniem,\n\n⟦NAME⟧\nDział księgowości\n⟦COMPANY⟧\ntel. ⟦phone:pl⟧\n⟦email:plain⟧",
]

NEG["pl"] = [
    "Wersja ⟦VER4⟧ jest już dostępna.",
    "Zamówienie nr ⟦ORDER10⟧ zostało wysłane ⟦DATE⟧.",
    "Faktura ⟦INVOICE⟧ na kwotę ⟦PRICE⟧.",
    "Numer przesyłki: ⟦NUM:6⟧⟦NUM:6⟧⟦NUM:6⟧.",
    "Zgłoszenie ⟦TICKET⟧ zostało zamknięte.",
    "Spotkanie ⟦DATE⟧ o ⟦TIME⟧, sala 3.14.",
    "Hasło musi mieć co najmniej 12 znaków.",
    "NIP firmy: ⟦NUM:3⟧-⟦NUM:3⟧-⟦NUM:2⟧-⟦NUM:2⟧.",
    "Rabat ⟦PCT⟧ został naliczony.",
    "Sygnatura akt I C ⟦NUM:4⟧/26.",
]

FRAMES["pl"] = [
    "{BODY}", "{BODY}",
    "Dzień dobry,\n\n{BODY}\n\nPozdrawiam,\n⟦NAME⟧",
    "Cześć ⟦RFIRST⟧! {BODY}",
]

POS["pt"] = [
    "Pode contactar-me através de ⟦email⟧.",
    "Envie os documentos para ⟦email⟧, por favor.",
    "E-mail: ⟦email:obf⟧",
    "Meu novo e-mail é ⟦email:idn⟧.",
    "O meu telemóvel é ⟦phone:pt⟧.",
    "Meu celular: ⟦phone:br⟧ (WhatsApp)",
    "Tel.: ⟦phone⟧",
    "Ligue para ⟦phone⟧ em caso de dúvida.",
    "Número do cartão: ⟦card⟧, validade 06/29.",
    "Paguei com o cartão ⟦card⟧ mas a compra não aparece.",
    "Por favor transfira para o IBAN ⟦iban:pt⟧.",
    "O reembolso deve ir para ⟦iban⟧, titular ⟦NAME⟧.",
    "IBAN: ⟦iban:pt+compact⟧",
    "Acesso a partir do IP ⟦ip⟧ às ⟦TIME⟧.",
    "O servidor ⟦ip:v4priv⟧ está em baixo.",
    "senha: ⟦cred:pw⟧",
    "A senha do wifi é ⟦cred:pw⟧",
    "Chave da API de teste: ⟦cred⟧",
    "Meu SSN americano é ⟦ssn⟧.",
    "§Atenciosamente,\n\n⟦NAME⟧\nDepartamento Financeiro\n⟦COMPANY⟧\nTel. ⟦phone⟧\n⟦email:plain⟧",
]

NEG["pt"] = [
    "A versão ⟦VER4⟧ já está disponível.",
    "A encomenda n.º ⟦ORDER10⟧ foi enviada em ⟦DATE⟧.",
    "Fatura ⟦INVOICE⟧ no valor de ⟦PRICE⟧.",
    "Código de rastreio: ⟦UPS⟧.",
    "O pedido ⟦TICKET⟧ foi encerrado.",
    "Reunião em ⟦DATE⟧ às ⟦TIME⟧, sala 2.10.",
    "A senha deve ter pelo menos 12 caracteres.",
    "NIF da empresa: 5⟦NUM:8⟧.",
    "Desconto de ⟦PCT⟧ aplicado.",
    "CNPJ 12.345.678/0001-95 consta na nota fiscal.",
]

FRAMES["pt"] = [
    "{BODY}", "{BODY}",
    "Olá ⟦RFIRST⟧,\n\n{BODY}\n\nAbraço,\n⟦FIRST⟧",
    "Prezados,\n\n{BODY}\n\nAtenciosamente,\n⟦NAME⟧",
]


POS["ja"] = [
    "ご連絡は⟦email:plain⟧までお願いいたします。",
    "資料は⟦email:plain⟧宛にお送りください。",
    "メール：⟦email:fw⟧",
    "新しいメールアドレスは⟦email:idn⟧です。",
    "お問い合わせ窓口：⟦email:role⟧",
    "電話：⟦phone:jp⟧",
    "携帯番号は⟦phone:jp⟧です。夕方以降なら出られます。",
    "TEL ⟦phone⟧ / FAX ⟦phone⟧",
    "折り返しのお電話は⟦phone⟧までお願いします。",
    "カード番号：⟦card⟧（有効期限 09/28）",
    "クレジットカード⟦card⟧で支払いましたが、二重に請求されています。",
    "JCBカード⟦card:jcb⟧の利用停止をお願いします。",
    "振込先のIBANは⟦iban⟧です。",
    "海外送金先：IBAN ⟦iban:de⟧、受取人 ⟦NAME⟧",
    "不審なログインがIPアドレス⟦ip⟧からありました。",
    "サーバー⟦ip:v4priv⟧に接続できません。",
    "パスワード：⟦cred:pw⟧",
    "初期パスワードは「⟦cred:pw⟧」です。ログイン後に変更してください。",
    "APIキーはこちらです：⟦cred⟧",
    "米国の社会保障番号（SSN）は⟦ssn⟧です。",
    "§⟦NAME⟧\n⟦COMPANY⟧ 営業部\n〒100-0005 ⟦ADDRESS⟧\nTEL：⟦phone:jp⟧\nMail：⟦email:plain⟧",
    "§氏名：⟦NAME⟧\n電話番号：⟦phone:jp⟧\nメールアドレス：⟦email⟧\nカード番号：⟦card⟧",
]

NEG["ja"] = [
    "バージョン⟦VER4⟧をリリースしました。",
    "ご注文番号⟦ORDER10⟧は⟦DATE⟧に発送済みです。",
    "請求書番号⟦INVOICE⟧、金額⟦PRICE⟧です。",
    "お問い合わせ番号：⟦TICKET⟧",
    "追跡番号は⟦NUM:4⟧-⟦NUM:4⟧-⟦NUM:4⟧です。",
    "会議は⟦DATE⟧の⟦TIME⟧から、会議室4.12で行います。",
    "パスワードは12文字以上にしてください。",
    "YOUR_API_KEYの部分をご自身のキーに置き換えてください。",
    "郵便番号は〒150-0002です。",
    "写真IMG_⟦IMGDATE⟧.jpgを添付します。",
    "割引率は⟦PCT⟧です。",
    "製造番号：⟦SERIAL⟧",
]

FRAMES["ja"] = [
    "{BODY}", "{BODY}",
    "⟦LAST⟧様\n\nいつもお世話になっております。\n{BODY}\n\nよろしくお願いいたします。",
    "お疲れさまです。{BODY}",
    "件名：お問い合わせ ⟦TICKET⟧\n\n{BODY}",
]

POS["zh"] = [
    "请通过⟦email:plain⟧与我联系。",
    "请把合同发到⟦email⟧，谢谢。",
    "邮箱：⟦email:idn⟧",
    "联系邮箱：⟦email:fw⟧",
    "客服邮箱：⟦email:role⟧",
    "我的手机号是⟦phone:cn⟧，有事随时打给我。",
    "电话：⟦phone⟧",
    "请回电⟦phone⟧，工作日9点到18点。",
    "台北办公室电话：⟦phone:tw⟧",
    "香港分公司：⟦phone:hk⟧",
    "卡号：⟦card⟧，有效期至2028年10月。",
    "我用信用卡⟦card⟧付款，但被扣了两次。",
    "收款账户IBAN：⟦iban⟧",
    "请汇款至IBAN ⟦iban:de⟧，收款人⟦NAME⟧。",
    "异常登录来自IP地址⟦ip⟧。",
    "服务器⟦ip:v4priv⟧连不上了。",
    "密码：⟦cred:pw⟧",
    "初始密码是⟦cred:pw⟧，登录后请修改。",
    "测试环境的API密钥：⟦cred⟧",
    "我的美国社会安全号码（SSN）是⟦ssn⟧。",
    "§姓名：⟦NAME⟧\n手机：⟦phone:cn⟧\n邮箱：⟦email⟧\n银行卡号：⟦card⟧",
    "§⟦NAME⟧\n⟦COMPANY⟧ 财务部\n地址：⟦ADDRESS⟧\n电话：⟦phone:cn⟧\n邮箱：⟦email:plain⟧",
]

NEG["zh"] = [
    "我们已经发布了版本⟦VER4⟧。",
    "订单号⟦ORDER10⟧已于⟦DATE⟧发货。",
    "发票号码⟦INVOICE⟧，金额⟦PRICE⟧。",
    "快递单号：SF⟦NUM:12⟧",
    "工单⟦TICKET⟧已关闭。",
    "会议时间：⟦DATE⟧ ⟦TIME⟧，地点412会议室。",
    "密码长度至少12位。",
    "请将YOUR_API_KEY替换为您自己的密钥。",
    "邮政编码100020。",
    "折扣为⟦PCT⟧。",
    "统一社会信用代码：91110000⟦NUM:9⟧X",
    "图片IMG_⟦IMGDATE⟧.jpg太大了。",
]

FRAMES["zh"] = [
    "{BODY}", "{BODY}",
    "您好，\n\n{BODY}\n\n谢谢！\n⟦NAME⟧",
    "【通知】{BODY}",
]

POS["ru"] = [
    "Пишите мне на ⟦email⟧.",
    "Пожалуйста, отправьте документы на ⟦email⟧ до пятницы.",
    "Почта: ⟦email:obf⟧",
    "Мой новый адрес: ⟦email:idn⟧",
    "Мой телефон: ⟦phone:ru⟧.",
    "Тел.: ⟦phone⟧, моб.: ⟦phone:ru⟧",
    "Перезвоните, пожалуйста, по номеру ⟦phone⟧.",
    "Номер карты: ⟦card⟧, срок действия 11/28.",
    "Я оплатил картой ⟦card⟧, но заказ не оплачен.",
    "Реквизиты для перевода: IBAN ⟦iban⟧.",
    "Верните деньги на счёт ⟦iban⟧, получатель ⟦NAME⟧.",
    "Вход с IP-адреса ⟦ip⟧ заблокирован.",
    "Сервер ⟦ip:v4priv⟧ не отвечает.",
    "пароль: ⟦cred:pw⟧",
    "Пароль от wifi: ⟦cred:pw⟧",
    "Ключ API для теста: ⟦cred⟧",
    "Мой американский номер социального страхования (SSN): ⟦ssn⟧",
    "§С уважением,\n⟦NAME⟧\nБухгалтерия, ⟦COMPANY⟧\nТел.: ⟦phone:ru⟧\nE-mail: ⟦email:plain⟧",
]

NEG["ru"] = [
    "Вышла версия ⟦VER4⟧.",
    "Заказ № ⟦ORDER10⟧ отправлен ⟦DATE⟧.",
    "Счёт ⟦INVOICE⟧ на сумму ⟦PRICE⟧.",
    "Трек-номер: RA⟦NUM:9⟧RU.",
    "Заявка ⟦TICKET⟧ закрыта.",
    "Встреча ⟦DATE⟧ в ⟦TIME⟧, переговорная 4.12.",
    "Пароль должен содержать не менее 12 символов.",
    "ИНН организации 77⟦NUM:8⟧.",
    "Скидка ⟦PCT⟧ уже учтена.",
    "Файл лежит в /var/log/app/⟦LONGID⟧.log.",
]

FRAMES["ru"] = [
    "{BODY}", "{BODY}",
    "Здравствуйте!\n\n{BODY}\n\nС уважением,\n⟦NAME⟧",
    "Привет, ⟦RFIRST⟧! {BODY}",
]

POS["ar"] = [
    "يمكنك مراسلتي على ⟦email⟧.",
    "يرجى إرسال المستندات إلى ⟦email⟧ قبل يوم الخميس.",
    "البريد الإلكتروني: ⟦email:idn⟧",
    "رقم الهاتف: \u200e⟦phone⟧\u200e",
    "للتواصل: ⟦phone:ae⟧",
    "اتصل بي على الرقم ⟦phone⟧ بعد الساعة الخامسة.",
    "رقم البطاقة: ⟦card⟧",
    "دفعت بالبطاقة \u200e⟦card⟧\u200e لكن الطلب لم يظهر.",
    "رقم الآيبان: ⟦iban⟧",
    "يرجى تحويل المبلغ إلى الحساب \u200e⟦iban⟧\u200e باسم ⟦NAME⟧.",
    "تم تسجيل الدخول من عنوان IP ⟦ip⟧.",
    "الخادم ⟦ip:v4priv⟧ لا يستجيب.",
    "كلمة المرور: ⟦cred:pw⟧",
    "مفتاح API للاختبار: ⟦cred⟧",
    "§⟦NAME⟧\n⟦COMPANY⟧\nهاتف: \u200e⟦phone⟧\u200e\nبريد: ⟦email:plain⟧",
]

NEG["ar"] = [
    "تم إصدار النسخة ⟦VER4⟧.",
    "تم شحن الطلب رقم ⟦ORDER10⟧ بتاريخ ⟦DATE⟧.",
    "رقم الفاتورة ⟦INVOICE⟧ بقيمة ⟦PRICE⟧.",
    "رقم التذكرة ⟦TICKET⟧.",
    "الاجتماع يوم ⟦DATE⟧ الساعة ⟦TIME⟧.",
    "يجب أن تتكون كلمة المرور من 12 حرفًا على الأقل.",
    "نسبة الخصم ⟦PCT⟧.",
    "رقم الشحنة ⟦UPS⟧.",
]

FRAMES["ar"] = [
    "{BODY}", "{BODY}",
    "مرحبًا،\n\n{BODY}\n\nمع التحية،\n⟦NAME⟧",
]

POS["hi"] = [
    "मुझसे ⟦email⟧ पर संपर्क करें।",
    "कृपया दस्तावेज़ ⟦email⟧ पर भेजें।",
    "ईमेल: ⟦email:idn⟧",
    "मेरा मोबाइल नंबर ⟦phone:in⟧ है।",
    "फ़ोन: ⟦phone⟧",
    "कार्ड नंबर: ⟦card⟧",
    "मैंने कार्ड ⟦card⟧ से भुगतान किया था।",
    "IP पता ⟦ip⟧ से लॉगिन हुआ।",
    "पासवर्ड: ⟦cred:pw⟧",
    "API कुंजी: ⟦cred⟧",
    "विदेश भुगतान के लिए IBAN: ⟦iban⟧",
    "§⟦NAME⟧\n⟦COMPANY⟧\nफ़ोन: ⟦phone:in⟧\nईमेल: ⟦email:plain⟧",
]

NEG["hi"] = [
    "संस्करण ⟦VER4⟧ जारी किया गया है।",
    "ऑर्डर नंबर ⟦ORDER10⟧ भेज दिया गया है।",
    "बिल संख्या ⟦INVOICE⟧, राशि ⟦PRICE⟧।",
    "टिकट ⟦TICKET⟧ बंद कर दिया गया।",
    "बैठक ⟦DATE⟧ को ⟦TIME⟧ बजे है।",
    "पासवर्ड कम से कम 12 अक्षरों का होना चाहिए।",
    "पिन कोड 110001 है।",
]

FRAMES["hi"] = ["{BODY}", "{BODY}", "नमस्ते,\n\n{BODY}\n\nधन्यवाद,\n⟦NAME⟧"]

POS["tr"] = [
    "Bana ⟦email⟧ adresinden ulaşabilirsiniz.",
    "Belgeleri ⟦email⟧ adresine gönderin lütfen.",
    "E-posta: ⟦email:obf⟧",
    "Yeni adresim ⟦email:idn⟧.",
    "Cep telefonum: ⟦phone:tr⟧",
    "Tel: ⟦phone⟧",
    "Lütfen ⟦phone⟧ numarasından beni arayın.",
    "Kart numarası: ⟦card⟧, son kullanma 02/28.",
    "⟦card⟧ numaralı kartımdan iki kez çekim yapıldı.",
    "IBAN: ⟦iban:tr⟧",
    "İadeyi ⟦iban⟧ hesabına yapın, alıcı ⟦NAME⟧.",
    "⟦ip⟧ IP adresinden giriş denemesi oldu.",
    "Sunucu ⟦ip:v4priv⟧ yanıt vermiyor.",
    "şifre: ⟦cred:pw⟧",
    "Wifi şifresi ⟦cred:pw⟧",
    "Test ortamı API anahtarı: ⟦cred⟧",
    "§Saygılarımla,\n⟦NAME⟧\n⟦COMPANY⟧\nTel: ⟦phone:tr⟧\n⟦email:plain⟧",
]

NEG["tr"] = [
    "⟦VER4⟧ sürümü yayınlandı.",
    "⟦ORDER10⟧ numaralı siparişiniz ⟦DATE⟧ tarihinde kargoya verildi.",
    "Fatura no ⟦INVOICE⟧, tutar ⟦PRICE⟧.",
    "Kargo takip numarası: ⟦NUM:12⟧.",
    "⟦TICKET⟧ numaralı talep kapatıldı.",
    "Toplantı ⟦DATE⟧ saat ⟦TIME⟧'da.",
    "Şifre en az 12 karakter olmalıdır.",
    "Vergi no: ⟦NUM:10⟧.",
    "İndirim oranı ⟦PCT⟧.",
]

FRAMES["tr"] = ["{BODY}", "{BODY}", "Merhaba ⟦RFIRST⟧,\n\n{BODY}\n\nİyi çalışmalar,\n⟦FIRST⟧"]

POS["he"] = [
    "אפשר לכתוב לי ל-⟦email⟧.",
    "טלפון: \u200e⟦phone⟧\u200e",
    "הנייד שלי ⟦phone:il⟧, אפשר גם בוואטסאפ.",
    "מספר כרטיס: ⟦card⟧",
    "מספר IBAN: ⟦iban:il⟧",
    "התחברות חשודה מכתובת ⟦ip⟧.",
    "סיסמה: ⟦cred:pw⟧",
]

NEG["he"] = [
    "גרסה ⟦VER4⟧ שוחררה היום.",
    "הזמנה מספר ⟦ORDER10⟧ נשלחה ב-⟦DATE⟧.",
    "חשבונית ⟦INVOICE⟧ על סך ⟦PRICE⟧.",
    "הפגישה ב-⟦TIME⟧ בחדר 4.12.",
]

FRAMES["he"] = ["{BODY}", "שלום,\n\n{BODY}\n\nתודה,\n⟦NAME⟧"]

NEGDOC.setdefault("ja", []).append(
    "§【ご注文確認】\nご注文番号：⟦ORDER10⟧\nご注文日：⟦DATE⟧\n商品：USBケーブル 2m ×2\n合計：⟦PRICE⟧（税込）\nお届け予定：⟦DATE⟧\n※パスワードやカード番号をメールでお尋ねすることはありません。")
NEGDOC.setdefault("zh", []).append(
    "§【发货通知】\n订单号：⟦ORDER10⟧\n下单时间：⟦DATE⟧ ⟦TIME⟧\n商品：蓝牙耳机 ×1\n实付：⟦PRICE⟧\n快递单号：SF⟦NUM:12⟧\n温馨提示：客服不会向您索要密码或验证码。")
NEGDOC.setdefault("fr", []).append(
    "§Bonjour,\n\nVotre commande ⟦ORDER⟧ du ⟦DATE⟧ a bien été expédiée. Numéro de suivi : 6A⟦NUM:11⟧. Montant réglé : ⟦PRICE⟧. La facture ⟦INVOICE⟧ est disponible dans votre espace client.\n\nNous ne vous demanderons jamais votre mot de passe par courriel.\n\nLe service client")
NEGDOC.setdefault("es", []).append(
    "§Estimado cliente:\n\nle confirmamos el pedido ⟦ORDER⟧ del ⟦DATE⟧ por un importe de ⟦PRICE⟧. El número de seguimiento es ⟦UPS⟧ y la factura ⟦INVOICE⟧ ya está disponible. Versión de la aplicación: ⟦VER4⟧.\n\nNunca le pediremos su contraseña ni los datos de su tarjeta por correo.\n\nAtentamente,\nAtención al cliente")

# ----------------------------------------------------------------- more templates
POS["en"] += [
    "Please update my contact email to ⟦email⟧; the old one belonged to my previous employer.",
    "to: ⟦email⟧; cc: ⟦email⟧; bcc: ⟦email:role⟧",
    "ping me on ⟦email:obf⟧, not on here",
    "Our data protection officer can be reached at ⟦email:role⟧ or by post.",
    "git config user.email \"⟦email:plain⟧\"",
    "Dial ⟦phone:us⟧, then press 3 for billing.",
    "WhatsApp: ⟦phone⟧",
    "The number you gave us, ⟦phone:uk⟧, goes straight to voicemail.",
    "Tel.: ⟦phone:ie⟧ (Mon–Fri 9:00–17:30)",
    "SMS the code to ⟦phone:in⟧ if the app fails.",
    "{\"pan\": \"⟦card:plain⟧\", \"exp\": \"11/28\", \"cvv\": \"***\"}",
    "Customer disputes the charge on ⟦card⟧; chargeback form attached.",
    "Card (virtual, single use): ⟦card:dash⟧",
    "for the IVR she typed ⟦card:space⟧ and it still said invalid",
    "Bank: ⟦COMPANY⟧, IBAN ⟦iban:dash⟧",
    "Our Luxembourg account is ⟦iban:lu⟧ (EUR only).",
    "pay.example.com/sepa?iban=⟦iban:compact⟧&amount=⟦AMOUNT⟧",
    "Please verify SSN ⟦ssn⟧ against the I-9 before Friday.",
    "SSN ⟦ssn:fw⟧ (typed on my phone's Japanese keyboard, sorry)",
    "\"ssn\": \"⟦ssn⟧\", \"status\": \"pending\"",
    "Our EIN is ⟦NUM:2⟧-⟦NUM:7⟧ but the employee's own SSN is ⟦ssn⟧.",
    "GET /admin from ⟦ip:v4⟧ returned 403",
    "the k8s node ⟦ip:v4priv⟧ is NotReady since 02:10",
    "mapped address ⟦ip:v6mapped⟧ shows up in the access logs",
    "DNS: shop.example.com A ⟦ip:v4⟧, AAAA ⟦ip:v6⟧",
    "ssh deploy@⟦ip:v4⟧ -p 2222",
    "Reverse proxy at ⟦ip:v6ula⟧ forwards to ⟦ip:v4priv⟧:8080.",
    "NPM_TOKEN=⟦cred:npm⟧ is set in the CI variables but publish still fails",
    "Here is the Hugging Face read token: ⟦cred:hf⟧",
    "AWS_SECRET_ACCESS_KEY=⟦cred:aws_secret⟧",
    "aws configure set aws_access_key_id ⟦cred:aws_id⟧",
    "OPENAI_API_KEY: \"⟦cred:openai⟧\"",
    "headers = {\"Authorization\": \"Bearer ⟦cred:jwt_rs⟧\"}",
    "mysql -u root -p⟦cred:pw⟧ shop < dump.sql",
    "oauth token: ⟦cred:gho⟧",
    "SLACK_USER_TOKEN=⟦cred:slackp⟧",
    "GOOGLE_MAPS_KEY=⟦cred:google⟧",
    "const stripe = require('stripe')('⟦cred:stripe⟧');",
    "The connection string in appsettings.json is ⟦cred:dburl_at⟧",
    "Twilio: ⟦cred:twilio⟧",
    "TWINE_PASSWORD=⟦cred:pypi⟧ twine upload dist/*",
    "§pasted from my phone's ssh app, sorry about the wrapping:\n⟦cred:pem_openssh_split⟧",
    "uv publish --token ⟦cred:pypi⟧",
    "§-- narrow tmux pane, copy as is --\n⟦cred:pem_openssh_split⟧\n-- end --",
    "§$ cat ~/.git-credentials\n⟦cred:giturl⟧",
    "§services:\n  db:\n    image: postgres:16.4\n    environment:\n      POSTGRES_USER: app\n      POSTGRES_PASSWORD: ⟦cred:pw⟧\n  web:\n    image: registry.example.com/shop/web:⟦VER4⟧\n    environment:\n      DATABASE_URL: ⟦cred:dburl⟧\n      SECRET_KEY_BASE: ⟦cred:hex32⟧",
    "§Run echo \"$DEPLOY_TOKEN\"\n⟦cred:github_pat⟧\nError: Process completed with exit code 1.",
    "§Please rotate this, it was sitting in the repo for two years:\n\n⟦cred:pem_pkcs8⟧",
    "§id_rsa from the jump host (old, but still in authorized_keys on prod!):\n⟦cred:pem_rsa⟧",
    "§employee_id;name;ssn;iban\n⟦ROWNUM⟧;⟦NAME⟧;⟦ssn⟧;⟦iban⟧⟦P⟧\n⟦ROWNUM⟧;⟦NAME⟧;⟦ssn⟧;⟦iban⟧",
    "§Chat transcript ⟦DATE⟧\nVisitor: hi i need to change the card on my account\nAgent: Sure! For your security please don't share the full number here.\nVisitor: too late lol its ⟦card⟧\nVisitor: and my email is ⟦email⟧\nAgent: Thanks, I have masked the card in our system.",
    "§Fraud report ⟦TICKET⟧\nCard: ⟦card⟧\nTransactions from IP ⟦ip:v4#f⟧ (3x) and ⟦ip:v6⟧\nCardholder phone: ⟦phone:us⟧\nNotes: ⟦ip#f⟧ is a known proxy exit node.",
    "§ValueError: invalid literal for int() with base 10: '⟦ssn:dash⟧'\n  File \"import_employees.py\", line 77, in parse_row\n    ssn = int(row[\"ssn\"])",
    "§{\"event\": \"customer.updated\", \"data\": {\"email\": \"⟦email:plain⟧\", \"phone\": \"⟦phone⟧\", \"iban\": \"⟦iban:compact⟧\"}, \"sent_from\": \"⟦ip:v4⟧\", \"attempt\": 1}",
    "§import openai\n\nclient = openai.OpenAI(api_key=\"⟦cred:openai⟧\")\nresp = client.responses.create(model=\"gpt-4.1\", input=\"ping\")\nprint(resp.output_text)",
    "§provider \"aws\" {\n  region     = \"us-east-1\"\n  access_key = \"⟦cred:aws_id⟧\"\n  secret_key = \"⟦cred:aws_secret⟧\"\n}",
    "§Hi,\n\nI'm writing about the double charge on my account. I was charged twice on ⟦DATE⟧ for order ⟦ORDER⟧ (invoice ⟦INVOICE⟧). The card is ⟦card⟧ and the account is registered to ⟦email⟧. You can also call me on ⟦phone⟧ any weekday after 4pm; if that doesn't work, my husband's number is ⟦phone⟧.\n\nI already contacted my bank and they said the merchant has to reverse it. Please refund to the card or, if that's easier, to my account ⟦iban⟧. I attached a screenshot (IMG_⟦IMGDATE⟧.png) showing both transactions, each ⟦PRICE⟧.\n\nThis is the third time I'm writing (tickets ⟦TICKET⟧ and ⟦TICKET⟧), so I'd appreciate a quick answer.\n\nThanks,\n⟦NAME⟧",
    "curl -H \"Authorization: Bearer ⟦cred:jwt⟧\" https://api.example.com/v1/me",
    "id_token=⟦cred:jwt⟧",
    "GH_TOKEN=⟦cred:ghp⟧ gh release create v2.0.0",
    "the bot token is ⟦cred:slack⟧, paste it into the app settings",
    "GITHUB_TOKEN=⟦cred:ghp⟧ ./release.sh",
    "HUGGING_FACE_HUB_TOKEN=⟦cred:hf⟧",
    "Bearer ⟦cred:bearer⟧ (expires in 1h)",
    "gitlab-runner register --url https://gitlab.example.com --token ⟦cred:glpat⟧",
    "SLACK_BOT_TOKEN=⟦cred:slack⟧",
]

NEG["en"] += [
    "Call extension 4471 if the printer jams again.",
    "The patch is in PR #⟦NUM:4⟧, commit ⟦SHORTSHA⟧.",
    "Monitor runs at 2560x1440 @ 144Hz over DisplayPort 1.4.",
    "Meet @ 7 at the pub?",
    "Mention @⟦FIRSTLOWER⟧ in the PR so they see it.",
    "Python 3.12.4 and pip 24.0 are required.",
    "Windows build 10.0.22631.⟦NUM:4⟧ fixed the driver crash.",
    "The ratio is 16:9, not 4:3.",
    "Lap times were 1:32:05, 1:31:58 and 1:33:12.",
    "UUID ⟦UUID⟧ not found in table users.",
    "VAT reg. no. GB ⟦NUM:3⟧ ⟦NUM:4⟧ ⟦NUM:2⟧, company no. 0⟦NUM:7⟧.",
    "Our EIN is ⟦NUM:2⟧-⟦NUM:7⟧ for the W-9.",
    "ZIP+4 ⟦ZIP⟧-⟦NUM:4⟧ is on the label.",
    "Routing number 0⟦NUM:8⟧ is printed at the bottom left of the cheque.",
    "Lot number L⟦NUM:6⟧, best before ⟦DATE⟧.",
    "Tickets start at $45; the VIP package is $120.",
    "Please call the main line and ask for accounts.",
    "sha1 ⟦SHA⟧ matches the published checksum.",
    "The reset link looks like https://example.com/reset?token=<redacted> in the logs, which is fine.",
    "AWS access key IDs start with AKIA followed by 16 characters.",
    "x-api-key header missing (HTTP 401).",
    "Set the ANTHROPIC_API_KEY environment variable before running the script.",
    "mongodb://localhost:27017/test works locally without auth.",
    "The IBAN field expects 15 to 34 characters: country code, two check digits, then the account number.",
    "The phone field accepts E.164 numbers like +<country code><number>.",
    "@everyone the office is closed on ⟦DATE⟧.",
    "Chrome ⟦VER4⟧ fixed the rendering bug.",
    "Gift card balance: ⟦PRICE⟧ (card ID ⟦BAD16G⟧).",
    "Your loyalty number is ⟦BAD16⟧; it is not a payment card.",
]

NEGDOC["en"] += [
    "§certifi==2026.10.5\ncharset-normalizer==3.4.0\nidna==3.10\nrequests==2.32.3\nurllib3==2.2.3\nprotobuf==5.28.3\ngrpcio==1.67.1\nmy-internal-lib==⟦VER4⟧",
    "§#include <iostream>\n#include <vector>\n\nint main() {\n    std::vector<int> v{1, 2, 3};\n    for (auto it = v.begin(); it != v.end(); ++it)\n        std::cout << std::hex << *it << \"::\" << 0xdeadbeef << std::endl;\n    return 0;\n}",
    "§# m h dom mon dow command\n30 2 * * 1-5 /opt/backup/run.sh --target s3://backups-⟦NUM:6⟧ --keep 14\n*/15 * * * * /usr/bin/flock -n /tmp/sync.lock /opt/sync/sync.py --since 2026-11-01T00:00:00Z",
    "§INVOICE ⟦INVOICE⟧\nDate: ⟦DATE⟧\nCustomer no.: ⟦CUSTREF⟧\n\nQty  Item                      Price\n2    Widget A (⟦PART⟧)       ⟦PRICE⟧\n1    Service fee               ⟦PRICE⟧\n\nTotal due: ⟦PRICE⟧\nPayment terms: 30 days net. Please quote the invoice number with your payment.",
    "§NAME                        READY   STATUS    RESTARTS   AGE\napi-7d9f8b6c5d-x2k4q         1/1     Running   0          3d4h\nworker-5c6b7d8e9f-9wz8m      1/1     Running   2          3d4h\nredis-0                      1/1     Running   0          12d\nmigrate-⟦NUM:8⟧-qq7lz        0/1     Completed 0          3d4h",
    "§eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n        ether ⟦MAC⟧  txqueuelen 1000  (Ethernet)\n        RX packets ⟦NUM:7⟧  bytes ⟦NUM:10⟧ (⟦NUM:3⟧.4 MB)\n        TX packets ⟦NUM:7⟧  bytes ⟦NUM:9⟧ (⟦NUM:2⟧.1 MB)",
    "§Shipment ⟦UPS⟧\n⟦DATE⟧ 07:42  Departed facility, Louisville KY\n⟦DATE⟧ 22:10  Arrived at facility\n⟦DATE⟧ 14:03  Label created, order ⟦ORDER10⟧\nWeight 2.4 kg, 3 pieces, reference ⟦INVOICE⟧",
]

POS["de"] += [
    "Der GitLab-Token für die Pipeline lautet ⟦cred:glpat⟧.",
    "AWS-Zugang: ⟦cred:aws_id⟧ / ⟦cred:aws_secret⟧",
    "Datenbank-URL: ⟦cred:dburl⟧",
    "Der OpenAI-Schlüssel ⟦cred:openai⟧ wurde versehentlich im Wiki gepostet und muss gesperrt werden.",
    "Bitte die IP ⟦ip:v6⟧ in die Firewall-Freigabe aufnehmen.",
]
POS["fr"] += [
    "Le jeton GitHub est ⟦cred:ghp⟧, je le révoque demain.",
    "Chaîne de connexion : ⟦cred:dburl⟧",
    "Clé Anthropic de l'équipe : ⟦cred:anthropic⟧",
]
POS["es"] += [
    "El token de Slack es ⟦cred:slack⟧, no lo subas al repositorio.",
    "Cadena de conexión: ⟦cred:dburl_at⟧",
    "Clave de Google Maps: ⟦cred:google⟧",
]
POS["it"] += ["Il token di Hugging Face è ⟦cred:hf⟧.", "Stringa di connessione: ⟦cred:dburl⟧"]
POS["ja"] += ["OpenAIのAPIキー：⟦cred:openai⟧", "接続文字列：⟦cred:dburl⟧", "秘密鍵を貼っておきます。\n⟦cred:pem_ec⟧"]
POS["zh"] += ["GitHub令牌：⟦cred:github_pat⟧", "数据库连接串：⟦cred:dburl⟧", "Stripe密钥：⟦cred:stripe⟧"]
POS["ru"] += ["Токен бота: ⟦cred:slack⟧", "Строка подключения: ⟦cred:dburl⟧", "Ключ SendGrid: ⟦cred:sendgrid⟧"]
POS["pt"] += ["Token do npm: ⟦cred:npm⟧", "String de conexão: ⟦cred:dburl⟧"]
POS["nl"] += ["De Stripe-sleutel is ⟦cred:stripe⟧.", "Token voor PyPI: ⟦cred:pypi⟧"]
POS["pl"] += ["Token GitLab: ⟦cred:glpat⟧", "Klucz AWS: ⟦cred:aws_id⟧"]
POS["tr"] += ["AWS erişim anahtarı: ⟦cred:aws_id⟧", "GitHub token: ⟦cred:ghp⟧"]


# ================================================================= assembly

LANG_WEIGHT = {"en": 46, "de": 10, "fr": 6, "es": 6, "it": 4, "nl": 3, "pl": 3, "pt": 3, "ja": 4,
               "zh": 4, "ru": 3, "ar": 2, "hi": 2, "tr": 2, "he": 1}
# credentials come in many more shapes than the other types, so they get a larger share
TYPE_WEIGHT = {t: 1.0 for t in TYPES}
TYPE_WEIGHT["credential"] = 1.7
NFD_LANGS = {"de", "fr", "es", "it", "pt", "pl", "tr", "nl"}
NO_SPACE = {"ja", "zh"}


def split_list(lst, part):
    if len(lst) <= 1:
        return list(lst)
    dev = [x for i, x in enumerate(lst) if i % 4 == 1]
    held = [x for i, x in enumerate(lst) if i % 4 != 1]
    return dev if part == "development" else held


def cred_kinds(tpl):
    return [(m.group(2) or "generic").split("+")[0] for m in PH.finditer(tpl) if m.group(1) == "cred"]


def retag(tpl, i):
    return re.sub(r"#(\w+)⟧", lambda m: f"#{m.group(1)}_{i}⟧", tpl)


class Builder:
    def __init__(self, part, seed, forbidden_values=frozenset(), forbidden_texts=frozenset()):
        self.part = part
        self.rng = random.Random(seed)
        self.pos = {l: split_list(v, part) for l, v in POS.items()}
        self.neg = {l: split_list(v, part) for l, v in NEG.items()}
        self.negdoc = {l: split_list(v, part) for l, v in NEGDOC.items()}
        self.frames = {l: split_list(v, part) for l, v in FRAMES.items()}
        self.counts = {t: 0 for t in TYPES}
        self.forbidden_values = forbidden_values
        self.texts = set(forbidden_texts)
        self.phones = []
        self.used = {}
        self.kinds = {}

    def kind_score(self, tpl):
        # prefer templates whose kind of secret has been produced least often
        ks = cred_kinds(tpl)
        return min((self.kinds.get(k, 0) for k in ks), default=0)

    def pick_lang(self, allowed):
        pairs = [(l, LANG_WEIGHT.get(l, 1)) for l in allowed]
        return wchoice(self.rng, pairs)

    def join(self, lang, parts):
        # sentences that end in a value (no final punctuation) get a line break,
        # so that a value is never glued to the next sentence
        style = self.rng.choice(["", "", "\n"] if lang in NO_SPACE else [" ", " ", " ", "\n", "\n\n"])
        out = parts[0]
        for p in parts[1:]:
            ends = out.rstrip()[-1:]
            if style.strip() == "" and "\n" not in style and ends not in ".!?。！？」）)":
                out += "\n" + p
            else:
                out += style + p
        return out

    def frame(self, lang, body):
        fr = self.rng.choice(self.frames.get(lang) or ["{BODY}"])
        return fr.replace("{BODY}", body)

    def neg_sentences(self, lang, k):
        pool = self.neg.get(lang) or []
        if not pool:
            return []
        return self.rng.sample(pool, min(k, len(pool)))

    def compose_pos(self, need):
        rng = self.rng
        langs = [l for l, ts in self.pos.items() if any(need in types_in(t) for t in ts)]
        lang = self.pick_lang(langs)
        cands = [t for t in self.pos[lang] if need in types_in(t)]
        if need == "credential":
            main = min(cands, key=lambda t: (self.kind_score(t), self.used.get(t, 0), rng.random()))
        else:
            main = min(cands, key=lambda t: (self.used.get(t, 0), self.kind_score(t), rng.random()))
        self.used[main] = self.used.get(main, 0) + 1
        for k in cred_kinds(main):
            self.kinds[k] = self.kinds.get(k, 0) + 1
        if main.startswith("§"):
            tpl = main[1:]
            if rng.random() < 0.25:
                extra = self.neg_sentences(lang, 1)
                if extra:
                    tpl = extra[0] + "\n\n" + tpl if rng.random() < 0.5 else tpl + "\n\n" + extra[0]
        else:
            parts = [main]
            n_extra = rng.choice([0, 0, 1, 1, 1, 2])
            low = sorted(self.counts, key=lambda t: (self.counts[t] / TYPE_WEIGHT[t], rng.random()))
            have = types_in(main)
            for t in low:
                if len(parts) > n_extra:
                    break
                c = [s for s in self.pos[lang] if not s.startswith("§") and t in types_in(s) and s not in parts]
                if c and t not in have:
                    pick = min(c, key=lambda s: (self.used.get(s, 0), rng.random()))
                    self.used[pick] = self.used.get(pick, 0) + 1
                    parts.append(pick)
                    have |= types_in(pick)
            parts += self.neg_sentences(lang, rng.choice([0, 0, 1, 1, 2, 3]))
            rng.shuffle(parts)
            parts = [retag(p, i) for i, p in enumerate(parts)]
            tpl = self.frame(lang, self.join(lang, parts))
        if rng.random() < 0.07:
            tpl = self.lengthen(lang, tpl)
        return lang, tpl

    def lengthen(self, lang, tpl):
        # an e-mail thread: the new message on top, older ones quoted below
        rng = self.rng
        docs = self.negdoc.get(lang) or ["§" + " ".join(self.neg_sentences(lang, 3))]
        quote = {"de": "Am ⟦DATE⟧ schrieb ⟦RNAME⟧:", "fr": "Le ⟦DATE⟧, ⟦RNAME⟧ a écrit :",
                 "es": "El ⟦DATE⟧, ⟦RNAME⟧ escribió:", "it": "Il ⟦DATE⟧ ⟦RNAME⟧ ha scritto:"}.get(lang, "On ⟦DATE⟧, ⟦RNAME⟧ wrote:")
        out = tpl
        for doc in rng.sample(docs, min(len(docs), 2)):
            extra = self.neg_sentences(lang, rng.choice([3, 4, 5]))
            body = doc[1:] + "\n" + " ".join(extra)
            out += "\n\n" + quote + "\n" + "\n".join("> " + ln for ln in body.split("\n"))
            if len(out) > 1100:
                break
        return out

    def compose_neg(self):
        rng = self.rng
        lang = self.pick_lang(list(self.neg))
        docs = self.negdoc.get(lang) or []
        if docs and rng.random() < 0.22:
            tpl = rng.choice(docs)[1:]
            if rng.random() < 0.3:
                tpl = self.frame(lang, tpl)
        else:
            parts = self.neg_sentences(lang, rng.choice([1, 2, 2, 3, 3, 4, 5]))
            tpl = self.frame(lang, self.join(lang, parts))
        if rng.random() < 0.08:
            tpl = self.lengthen(lang, tpl)
        return lang, tpl

    def accept(self, text, labels):
        if text in self.texts:
            return False
        if len(text) > 3200:
            return False
        for lab in labels:
            v = lab["value"]
            if v not in text or v in self.forbidden_values:
                return False
            if text.count(v) != sum(1 for x in labels if x["value"] == v):
                return False
            if sum(1 for x in labels if x["value"] != v and v in x["value"]):
                return False
        return True

    def finish(self, lang, tpl):
        ctx = Ctx(self.rng, lang)
        text, labels = render(tpl, ctx)
        if lang in NFD_LANGS and self.rng.random() < 0.1:
            text = unicodedata.normalize("NFD", text)
            labels = [{"entity": l["entity"], "value": unicodedata.normalize("NFD", l["value"])} for l in labels]
        return text, labels, ctx.meta.get("phones", [])

    def build(self, n_total, n_pos, min_per_type):
        rows = []
        kinds = ["pos"] * n_pos + ["neg"] * (n_total - n_pos)
        self.rng.shuffle(kinds)
        i = 0
        while i < len(kinds) or any(self.counts[t] < min_per_type * TYPE_WEIGHT[t] for t in TYPES):
            kind = kinds[i] if i < len(kinds) else "pos"
            for _ in range(200):
                if kind == "pos":
                    need = min(TYPES, key=lambda t: (self.counts[t] / TYPE_WEIGHT[t], self.rng.random()))
                    lang, tpl = self.compose_pos(need)
                else:
                    lang, tpl = self.compose_neg()
                text, labels, phones = self.finish(lang, tpl)
                if kind == "neg" and labels:
                    raise AssertionError(tpl)
                if kind == "pos" and not labels:
                    continue
                if self.accept(text, labels):
                    break
            else:
                raise RuntimeError("could not build an acceptable text")
            self.texts.add(text)
            for lab in labels:
                self.counts[lab["entity"]] += 1
            self.phones += phones
            rows.append({"lang": lang, "text": text, "labels": labels})
            i += 1
        prefix = "development" if self.part == "development" else "heldout"
        for k, r in enumerate(rows, 1):
            r["id"] = f"{prefix}-{k:03d}"
        return [{"id": r["id"], "lang": r["lang"], "text": r["text"], "labels": r["labels"]} for r in rows]


# ================================================================= checks

def iban_ok(v):
    s = re.sub(r"[\s\u00a0\u2009\u202f\u00ad\-]", "", v).upper()
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]+", s):
        return False
    r = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in r)) % 97 == 1


def card_digits(v):
    v = unicodedata.normalize("NFKC", v)
    return re.sub(r"\D", "", v)


def ssn_ok(v):
    d = re.sub(r"\D", "", unicodedata.normalize("NFKC", v))
    if len(d) != 9:
        return False
    a, g, s = d[:3], d[3:5], d[5:]
    return a not in ("000", "666") and a[0] != "9" and g != "00" and s != "0000"


def check(rows, phones, strict_libs):
    problems = []
    for r in rows:
        for lab in r["labels"]:
            v = lab["value"]
            if v not in r["text"]:
                problems.append((r["id"], "not a substring", v))
            if lab["entity"] not in TYPES:
                problems.append((r["id"], "bad entity", lab["entity"]))
            if lab["entity"] == "card":
                d = card_digits(v)
                if not (13 <= len(d) <= 19 and luhn_ok(d)):
                    problems.append((r["id"], "card fails Luhn", v))
            if lab["entity"] == "iban" and not iban_ok(v):
                problems.append((r["id"], "iban fails mod-97", v))
            if lab["entity"] == "national_id" and not ssn_ok(v):
                problems.append((r["id"], "bad ssn", v))
    if strict_libs:
        try:
            from stdnum import iban as sn_iban, luhn as sn_luhn
            for r in rows:
                for lab in r["labels"]:
                    if lab["entity"] == "iban":
                        c = re.sub(r"[\s\u00a0\u2009\u202f\u00ad\-]", "", lab["value"]).upper()
                        if not sn_iban.is_valid(c):
                            problems.append((r["id"], "stdnum iban invalid", lab["value"]))
                    if lab["entity"] == "card" and not sn_luhn.is_valid(card_digits(lab["value"])):
                        problems.append((r["id"], "stdnum luhn invalid", lab["value"]))
        except ImportError:
            print("python-stdnum not installed; skipped its checks", file=sys.stderr)
        try:
            import phonenumbers
            for v, region in phones:
                w = re.sub(r"[\u00a0\u2009\u202f]", " ", v)
                w = re.sub(r"[\u2010-\u2013\u2212]", "-", w)
                try:
                    n = phonenumbers.parse(w, region)
                    ok = phonenumbers.is_valid_number(n)
                except phonenumbers.NumberParseException:
                    ok = False
                if not ok:
                    problems.append(("phone", "phonenumbers says invalid", f"{v!r} {region}"))
        except ImportError:
            print("phonenumbers not installed; skipped phone checks", file=sys.stderr)
    return problems


def table(name, rows):
    c = {t: 0 for t in TYPES}
    for r in rows:
        for lab in r["labels"]:
            c[lab["entity"]] += 1
    tot = sum(c.values())
    npos = sum(1 for r in rows if r["labels"])
    nonen = sum(1 for r in rows if r["lang"] != "en")
    uni = sum(1 for r in rows if r["lang"] == "en" and any(ord(ch) > 127 for ch in r["text"]))
    print(f"\n{name}: {len(rows)} texts, {npos} with labels ({npos / len(rows):.0%}), "
          f"{len(rows) - npos} without; non-English {nonen}, English with non-ASCII {uni}")
    print(f"  {'entity':<12} {'values':>6} {'share':>6}")
    for t in TYPES:
        print(f"  {t:<12} {c[t]:>6} {c[t] / tot:>6.1%}")
    print(f"  {'total':<12} {tot:>6}")
    return c


def main():
    dev = Builder("development", SEED)
    dev_rows = dev.build(106, 46, 14)
    dev_values = frozenset(l["value"] for r in dev_rows for l in r["labels"])
    held = Builder("heldout", SEED + 1, forbidden_values=dev_values,
                   forbidden_texts=frozenset(r["text"] for r in dev_rows))
    held_rows = held.build(350, 155, 44)
    for name, rows in (("development.jsonl", dev_rows), ("heldout.jsonl", held_rows)):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    strict = "--check" in sys.argv
    problems = check(dev_rows, dev.phones, strict) + check(held_rows, held.phones, strict)
    cd = table("development.jsonl", dev_rows)
    ch = table("heldout.jsonl", held_rows)
    hv = set(l["value"] for r in held_rows for l in r["labels"])
    if hv & dev_values:
        problems.append(("both", "value in both files", sorted(hv & dev_values)[:5]))
    if set(r["text"] for r in held_rows) & set(r["text"] for r in dev_rows):
        problems.append(("both", "text in both files", ""))
    tot = sum(ch.values())
    for t in TYPES:
        if ch[t] < 40 or ch[t] < 0.12 * tot:
            problems.append(("heldout", "too few values", t))
        if cd[t] < 12:
            problems.append(("development", "too few values", t))
    for p in problems:
        print("PROBLEM", *p)
    print("\nOK" if not problems else f"\n{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
