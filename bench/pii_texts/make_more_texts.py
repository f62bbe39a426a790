#!/usr/bin/env python3
"""Generate ``development_more.jsonl``: a second development set of labelled texts.

The texts follow the format and label conventions in ``README.md`` but come
from their own sentence templates, value generators and seed, so they share
neither templates nor values with ``development.jsonl`` and ``heldout.jsonl``.

    python make_more_texts.py            # write development_more.jsonl, print counts
    python make_more_texts.py --check    # validate the committed file, print counts

Validation uses ``phonenumbers`` and ``python-stdnum`` (both required here).
Every labelled value is checked when it is generated (Luhn, mod 97 and the
national IBAN check digits, SSN ranges, phone numbering plans, IP syntax) and
again, where the written form allows it, when the file is read back.
"""

from __future__ import annotations

import argparse
import base64
import collections
import ipaddress
import json
import random
import re
import string
import sys
import unicodedata
from pathlib import Path

import phonenumbers
from stdnum import iban as std_iban
from stdnum import luhn as std_luhn
from stdnum.us import ssn as std_ssn

SEED = 48611
N_POS = 140
N_NEG = 160
PREFIX = "development_more"
OUT = Path(__file__).with_name("development_more.jsonl")

NBSP, THIN, NNBSP, ZWSP, SHY, LRM = "\u00a0", "\u2009", "\u202f", "\u200b", "\u00ad", "\u200e"
NBHY, HYPH, ENDASH, FWSP = "\u2011", "\u2010", "\u2013", "\u3000"
ENTITIES = ["email", "phone", "card", "iban", "national_id", "ip_address", "credential"]
NFD_LANGS = {"de", "fr", "es", "it", "pt", "pl", "tr", "nl"}

AN = string.ascii_letters + string.digits
UPDIG = string.ascii_uppercase + string.digits
LODIG = string.ascii_lowercase + string.digits
B64 = AN + "+/"
B64URL = AN + "-_"


def fullwidth(s: str) -> str:
    out = []
    for ch in s:
        if "0" <= ch <= "9":
            out.append(chr(ord(ch) - 0x30 + 0xFF10))
        elif ch == "+":
            out.append("\uff0b")
        elif ch == "-":
            out.append("\uff0d")
        elif ch == " ":
            out.append(FWSP)
        elif ch == "(":
            out.append("\uff08")
        elif ch == ")":
            out.append("\uff09")
        else:
            out.append(ch)
    return "".join(out)


def ascii_fold(s: str) -> str:
    s = s.replace("ß", "ss").replace("ł", "l").replace("Ł", "L").replace("ı", "i").replace("ø", "o")
    s = unicodedata.normalize("NFKD", s)
    return "".join(c for c in s if not unicodedata.combining(c))


def luhn_ok(digits: str) -> bool:
    return std_luhn.is_valid(digits)


def luhn_digit(body: str) -> str:
    return std_luhn.calc_check_digit(body)


# --------------------------------------------------------------------------
# Names, domains, words
# --------------------------------------------------------------------------

# (native first, native last, roman first, roman last)
NAMES = {
    "en": [("Emily", "Carter"), ("James", "Nguyen"), ("Priya", "Raman"), ("Marcus", "O'Neill"),
           ("Hannah", "Walker"), ("Daniel", "Reyes"), ("Olivia", "Hughes"), ("Tom", "Brooks"),
           ("Grace", "Okafor"), ("Kevin", "Lindqvist"), ("Aisha", "Bello"), ("Ryan", "McAllister")],
    "de": [("Lukas", "Schäfer"), ("Anna", "Krüger"), ("Jonas", "Weiß"), ("Lea", "Hoffmann"),
           ("Felix", "Brandt"), ("Sophie", "Köhler"), ("Matthias", "Vogel"), ("Katrin", "Lorenz"),
           ("Jürgen", "Bäumer"), ("Sabine", "Großmann")],
    "fr": [("Camille", "Lefèvre"), ("Louis", "Moreau"), ("Chloé", "Girard"), ("Hugo", "Fontaine"),
           ("Léa", "Rousseau"), ("Mathieu", "Bérard"), ("Élodie", "Marchand"), ("Antoine", "Dufresne")],
    "es": [("Lucía", "García"), ("Javier", "Fernández"), ("Marta", "López"), ("Alejandro", "Muñoz"),
           ("Sofía", "Ortega"), ("Diego", "Martínez")],
    "it": [("Giulia", "Rossi"), ("Marco", "Bianchi"), ("Francesca", "Esposito"), ("Luca", "Romano"),
           ("Chiara", "Colombo"), ("Niccolò", "Galli")],
    "nl": [("Daan", "de Vries"), ("Sanne", "Jansen"), ("Bram", "van Dijk"), ("Lotte", "Bakker"),
           ("Joost", "Visser"), ("Femke", "Smit")],
    "pl": [("Katarzyna", "Wiśniewska"), ("Piotr", "Kowalczyk"), ("Agnieszka", "Wójcik"),
           ("Tomasz", "Zieliński"), ("Magdalena", "Lewandowska"), ("Paweł", "Dąbrowski")],
    "pt": [("João", "Silva"), ("Ana", "Conceição"), ("Pedro", "Oliveira"), ("Mariana", "Gonçalves"),
           ("Rafael", "Pereira"), ("Beatriz", "Araújo")],
    "tr": [("Emre", "Yılmaz"), ("Elif", "Kaya"), ("Burak", "Demir"), ("Zeynep", "Şahin"),
           ("Mehmet", "Çelik"), ("Ayşe", "Öztürk")],
    "ja": [("翔太", "佐藤", "shota", "sato"), ("陽子", "鈴木", "yoko", "suzuki"), ("健一", "高橋", "kenichi", "takahashi"),
           ("美咲", "田中", "misaki", "tanaka"), ("大輔", "渡辺", "daisuke", "watanabe"), ("由美", "伊藤", "yumi", "ito")],
    "zh": [("伟", "王", "wei", "wang"), ("芳", "李", "fang", "li"), ("娜", "张", "na", "zhang"),
           ("敏", "刘", "min", "liu"), ("静", "陈", "jing", "chen"), ("强", "杨", "qiang", "yang")],
    "ru": [("Алексей", "Иванов", "aleksei", "ivanov"), ("Ольга", "Смирнова", "olga", "smirnova"),
           ("Дмитрий", "Кузнецов", "dmitry", "kuznetsov"), ("Наталья", "Попова", "natalia", "popova"),
           ("Сергей", "Соколов", "sergey", "sokolov"), ("Екатерина", "Волкова", "ekaterina", "volkova")],
    "ar": [("محمد", "العتيبي", "mohammed", "alotaibi"), ("فاطمة", "الحربي", "fatimah", "alharbi"),
           ("أحمد", "القحطاني", "ahmed", "alqahtani"), ("نورة", "الشمري", "noura", "alshammari"),
           ("خالد", "الزهراني", "khalid", "alzahrani")],
    "he": [("נועה", "כהן", "noa", "cohen"), ("איתי", "לוי", "itai", "levi"), ("מיכל", "מזרחי", "michal", "mizrahi"),
           ("יונתן", "פרץ", "yonatan", "peretz"), ("תמר", "ביטון", "tamar", "biton")],
    "hi": [("राहुल", "शर्मा", "rahul", "sharma"), ("प्रिया", "वर्मा", "priya", "verma"), ("अमित", "गुप्ता", "amit", "gupta"),
           ("नेहा", "सिंह", "neha", "singh"), ("विकास", "पटेल", "vikas", "patel")],
}

DOMAINS = {
    "en": ["example.com", "example.org", "gmail.com", "outlook.com", "yahoo.com", "icloud.com", "proton.me",
           "northwind-traders.com", "fastmail.fm", "harbourlane.co.uk", "bluegum.com.au"],
    "de": ["web.de", "gmx.de", "t-online.de", "posteo.de", "mailbox.org", "kanzlei-brandt.de", "gmx.at", "bluewin.ch"],
    "fr": ["orange.fr", "free.fr", "laposte.net", "sfr.fr", "gmail.com", "skynet.be"],
    "es": ["gmail.com", "hotmail.es", "telefonica.net", "yahoo.es", "prodigy.net.mx"],
    "it": ["libero.it", "virgilio.it", "tiscali.it", "gmail.com", "studiolegale-galli.it"],
    "nl": ["ziggo.nl", "kpnmail.nl", "xs4all.nl", "hotmail.nl", "telenet.be"],
    "pl": ["wp.pl", "onet.pl", "o2.pl", "interia.pl", "gmail.com"],
    "pt": ["uol.com.br", "bol.com.br", "sapo.pt", "gmail.com", "terra.com.br"],
    "tr": ["gmail.com", "hotmail.com.tr", "yandex.com.tr", "ttmail.com"],
    "ja": ["docomo.ne.jp", "yahoo.co.jp", "ezweb.ne.jp", "gmail.com", "i.softbank.jp"],
    "zh": ["qq.com", "163.com", "126.com", "sina.com", "foxmail.com"],
    "ru": ["yandex.ru", "mail.ru", "rambler.ru", "gmail.com", "bk.ru"],
    "ar": ["gmail.com", "hotmail.com", "outlook.sa", "emirates.net.ae"],
    "he": ["walla.co.il", "gmail.com", "bezeqint.net", "012.net.il"],
    "hi": ["gmail.com", "rediffmail.com", "yahoo.co.in", "outlook.in"],
}

IDN_EMAILS = {
    "de": ["jürgen.bäumer@bäckerei-müller.de", "kontakt@größenwahn-verlag.de", "anmeldung@schützenverein-öhringen.de"],
    "fr": ["hélène.leclère@café-français.fr", "réservation@hôtel-étoile.fr"],
    "es": ["josé.muñoz@correo.es", "info@peñaflor-viñedos.es"],
    "tr": ["ayşe.öztürk@şirket.com.tr", "iletişim@çiçekçi.com.tr"],
    "ru": ["иван.петров@почта.рф", "заказ@магазин-книг.рф"],
    "zh": ["王伟@公司.中国", "客服@例子.公司"],
    "ja": ["山田太郎@例え.jp", "お問い合わせ@会社.jp"],
    "pl": ["zażółć@gęślą.pl", "biuro@łódź-meble.pl"],
    "hi": ["राहुल@डाटामेल.भारत"],
}

ROLE_LOCALS = ["info", "billing", "support", "no-reply", "accounts", "hr", "kontakt", "facturation",
               "ops-alerts", "dpo", "payroll", "reservations", "helpdesk"]

PW_WORDS = {
    "en": ["Sunflower", "Maple", "Harbor", "Tiger", "Falcon", "Biscuit", "Orchard", "Pumpkin"],
    "de": ["Sommer", "Kaffee", "Bergsee", "Fahrrad", "Katze", "Feierabend", "Lindenbaum"],
    "fr": ["Soleil", "Chocolat", "Montagne", "Papillon", "Baguette", "Lavande"],
    "es": ["Verano", "Playa", "Girasol", "Tortuga", "Mariposa", "Naranja"],
    "it": ["Gelato", "Tramonto", "Cavallo", "Limone", "Farfalla", "Vesuvio"],
    "nl": ["Tulp", "Fiets", "Molen", "Hagelslag", "Kaaskop"],
    "pl": ["Jesien", "Zubr", "Kwiatek", "Pierogi", "Wisla", "Bursztyn"],
    "pt": ["Saudade", "Praia", "Cajueiro", "Sardinha", "Ipanema", "Laranja"],
    "tr": ["Kartal", "Deniz", "Lale", "Simit", "Bogaz", "Kelebek"],
    "ru": ["Medved", "Zvezda", "Berezka", "Sputnik", "Matryoshka"],
}
PW_SYMS = "!#$%&*+-=?_."


# --------------------------------------------------------------------------
# IBAN
# --------------------------------------------------------------------------

# country: list of (count, kind) for the BBAN; kind n=digit, a=upper letter, c=upper alnum,
# or a fixed literal string.
IBAN_BBAN = {
    "DE": [(18, "n")], "AT": [(16, "n")], "CH": [(5, "n"), (12, "n")], "LI": [(5, "n"), (12, "n")],
    "NL": [("BANK:ABNA,INGB,RABO,TRIO,KNAB,SNSB"), (10, "n")], "GB": [("BANK:NWBK,BARC,LOYD,HBUK,MIDL"), (14, "n")],
    "IE": [("BANK:AIBK,BOFI,IPBS"), (14, "n")], "SE": [(20, "n")], "DK": [(14, "n")], "FI": [(14, "n")],
    "LU": [(3, "n"), (13, "n")], "CZ": [(20, "n")], "SK": [(20, "n")], "HU": [(24, "n")],
    "RO": [("BANK:BTRL,RNCB,BRDE,INGB"), (16, "n")], "HR": [(17, "n")], "SI": [("56"), (13, "n")],
    "TR": [(5, "n"), ("0"), (16, "n")], "SA": [(2, "n"), (18, "n")], "AE": [(3, "n"), (16, "n")],
    "IL": [(19, "n")], "GR": [(7, "n"), (16, "n")], "LT": [(16, "n")], "EE": [(16, "n")],
    "BG": [("BANK:BNBG,UNCR,STSA,FINV"), (6, "n"), (8, "n")], "MT": [("BANK:MALT,VALL,APSB"), (5, "n"), (18, "n")],
    "PL": [(24, "n")], "LV": [("BANK:HABA,UNLA,PARX"), (13, "n")], "IS": [(22, "n")], "CY": [(8, "n"), (16, "n")],
}
# national check digits are computed for these
IBAN_NATIONAL = ["BE", "ES", "FR", "IT", "NO", "PT"]


def iban_check_digits(cc: str, bban: str) -> str:
    s = bban + cc + "00"
    num = "".join(str(int(ch, 36)) for ch in s)
    return f"{98 - int(num) % 97:02d}"


def iban_mod97_ok(compact: str) -> bool:
    s = compact[4:] + compact[:4]
    num = "".join(str(int(ch, 36)) for ch in s)
    return int(num) % 97 == 1


def _es_dc(ten: str) -> str:
    w = [1, 2, 4, 8, 5, 10, 9, 7, 3, 6]
    d = 11 - sum(int(a) * b for a, b in zip(ten, w)) % 11
    return "0" if d == 11 else "1" if d == 10 else str(d)


def _fr_key(bank: str, branch: str, acct: str) -> str:
    return f"{97 - ((89 * int(bank) + 15 * int(branch) + 3 * int(acct)) % 97):02d}"


_IT_ODD = [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23]


def _it_cin(rest: str) -> str:
    total = 0
    for i, ch in enumerate(rest):
        v = int(ch) if ch.isdigit() else ord(ch) - 65
        total += _IT_ODD[v] if i % 2 == 0 else v
    return chr(65 + total % 26)


def _pt_check(s19: str) -> str:
    return f"{98 - (int(s19) * 100) % 97:02d}"


def _no_check(ten: str) -> str | None:
    w = [5, 4, 3, 2, 7, 6, 5, 4, 3, 2]
    r = sum(int(a) * b for a, b in zip(ten, w)) % 11
    c = 0 if r == 0 else 11 - r
    return None if c == 10 else str(c)


def national_ok(compact: str) -> bool:
    cc, bban = compact[:2], compact[4:]
    if cc == "BE":
        c = int(bban[:10]) % 97 or 97
        return bban[10:] == f"{c:02d}"
    if cc == "ES":
        return bban[8:10] == _es_dc("00" + bban[:8]) + _es_dc(bban[10:])
    if cc == "FR":
        return bban[21:] == _fr_key(bban[:5], bban[5:10], bban[10:21])
    if cc == "IT":
        return bban[0] == _it_cin(bban[1:])
    if cc == "NO":
        return bban[10] == _no_check(bban[:10])
    if cc == "PT":
        return bban[19:] == _pt_check(bban[:19])
    return True


# self-test against published example IBANs
assert national_ok("FR7630006000011234567890189")
assert national_ok("IT60X0542811101000000123456")
assert national_ok("PT50000201231234567890154")
assert national_ok("BE68539007547034")
assert national_ok("ES9121000418450200051332")
assert national_ok("NO9386011117947")


def iban_compact_valid(compact: str) -> bool:
    return iban_mod97_ok(compact) and national_ok(compact) and std_iban.is_valid(compact)


# --------------------------------------------------------------------------
# Phones
# --------------------------------------------------------------------------

LANG_REGIONS = {
    "en": ["US", "GB", "CA", "AU", "IE", "ZA", "SG", "NZ", "NG"], "de": ["DE", "AT", "CH"], "fr": ["FR", "BE", "CH"],
    "es": ["ES", "MX", "AR", "CO"], "it": ["IT"], "nl": ["NL", "BE"], "pl": ["PL"], "pt": ["PT", "BR"],
    "ja": ["JP"], "zh": ["CN", "HK", "TW"], "ru": ["RU"], "ar": ["SA", "AE", "EG"], "he": ["IL"],
    "hi": ["IN"], "tr": ["TR"],
}
NANP_AREAS = {"US": ["212", "415", "312", "617", "206", "303", "512", "646", "718", "404", "305", "213", "702", "503",
                      "614", "919", "480", "971"],
              "CA": ["416", "604", "514", "403", "613", "902", "780", "647", "905"]}
TRUNK0 = {"DE", "AT", "CH", "GB", "NL", "BE", "FR"}
PT = phonenumbers.PhoneNumberType
PNF = phonenumbers.PhoneNumberFormat


def phone_valid(value: str, region: str) -> bool:
    s = unicodedata.normalize("NFKC", value)
    for d in (NBHY, HYPH, ENDASH, "\u2012", "\u2014", "\u2212"):
        s = s.replace(d, "-")
    s = s.replace("(0)", "").replace(ZWSP, "").replace(SHY, "")
    try:
        n = phonenumbers.parse(s, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(n)


# --------------------------------------------------------------------------
# Generator
# --------------------------------------------------------------------------


class Label:
    __slots__ = ("entity", "value", "meta")

    def __init__(self, entity, value, meta=None):
        self.entity, self.value, self.meta = entity, value, meta or {}


class Gen:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.used: set[str] = set()
        self.meta: list[tuple[str, str, dict]] = []  # (entity, value, meta) for validation

    # ---- small helpers
    def rs(self, n, alphabet=AN):
        return "".join(self.r.choice(alphabet) for _ in range(n))

    def rs_edge(self, n, alphabet):
        """random string whose first and last characters are alphanumeric"""
        if n < 3:
            return self.rs(n, AN)
        return self.rs(1, AN) + self.rs(n - 2, alphabet) + self.rs(1, AN)

    def digits(self, n, lead_zero=False):
        if lead_zero:
            return "0" + self.rs(n - 1, string.digits)
        return self.r.choice("123456789") + self.rs(n - 1, string.digits)

    def fresh(self, fn, key=lambda v: v):
        for _ in range(500):
            v = fn()
            k = key(v)
            if k not in self.used:
                self.used.add(k)
                return v
        raise RuntimeError("could not find a fresh value")

    # ---- persons
    def person(self, lang):
        entry = self.r.choice(NAMES[lang])
        if len(entry) == 2:
            first, last = entry
            return {"first": first, "last": last, "rf": ascii_fold(first), "rl": ascii_fold(last)}
        first, last, rf, rl = entry
        return {"first": first, "last": last, "rf": rf, "rl": rl}

    # ---- email
    def email(self, lang, style, person):
        r = self.r
        styles = ["plain"] * 6 + ["upper", "obf1", "obf2", "obf3", "role", "shy", "plus"]
        if lang in IDN_EMAILS:
            styles += ["idn", "idn"]
        if lang in ("ja", "zh"):
            styles += ["fw", "fw"]
        if style in ("", "*"):
            style = r.choice(styles)

        def make():
            rf = re.sub(r"[^a-z]", "", person["rf"].lower()) or "user"
            rl = re.sub(r"[^a-z]", "", person["rl"].lower()) or "mail"
            dom = r.choice(DOMAINS.get(lang, DOMAINS["en"]))
            local = r.choice([f"{rf}.{rl}", f"{rf[0]}.{rl}", f"{rf}{rl}{r.randint(7, 99)}", f"{rf}_{rl}",
                              f"{rl}.{rf}", f"{rf}{r.randint(1970, 2005)}", f"{rf[0]}{rl}"])
            if style == "plain":
                return f"{local}@{dom}"
            if style == "plus":
                return f"{local}+{r.choice(['orders', 'news', 'bank', 'shop', 'tax'])}@{dom}"
            if style == "upper":
                return r.choice([f"{local}@{dom}".upper(), f"{rf.capitalize()}.{rl.capitalize()}@{dom.capitalize()}"])
            if style == "role":
                return f"{r.choice(ROLE_LOCALS)}@{r.choice(DOMAINS['en'][7:] + DOMAINS.get(lang, [])[-2:])}"
            if style == "obf1":
                name, tld = dom.rsplit(".", 1)
                return f"{local} [at] {name.replace('.', ' [dot] ')} [dot] {tld}"
            if style == "obf2":
                return f"{local}(at){dom}"
            if style == "obf3":
                name, tld = dom.rsplit(".", 1)
                return f"{rf} at {name.replace('.', ' dot ')} dot {tld}"
            if style == "fw":
                return f"{local}＠{dom}"
            if style == "shy":
                cut = r.randint(2, len(local) - 1)
                return f"{local[:cut]}{SHY}{local[cut:]}@{dom}"
            if style == "idn":
                free = [e for e in IDN_EMAILS[lang] if e.lower() not in self.used]
                return r.choice(free) if free else f"{local}@{dom}"
            raise ValueError(style)

        v = self.fresh(make, key=lambda v: v.lower())
        self.meta.append(("email", v, {"style": style}))
        return v

    # ---- phone
    def phone(self, lang, region, style):
        r = self.r
        if region in ("", "*"):
            region = r.choice(LANG_REGIONS[lang])
        styles = ["intl", "intl", "nat", "nat", "e164", "nbsp", "thin", "dash"]
        if region in TRUNK0:
            styles.append("trunk0")
        if region in ("FR", "BE", "US", "CA", "ES", "PT"):
            styles.append("dots")
        if region in ("DE", "AT"):
            styles.append("slash")
        if lang in ("ja", "zh"):
            styles += ["fw", "fw"]
        if style in ("", "*"):
            style = r.choice(styles)

        def make():
            ptype = r.choice([PT.MOBILE, PT.FIXED_LINE])
            ex = phonenumbers.example_number_for_type(region, ptype) or phonenumbers.example_number(region)
            nsn = phonenumbers.national_significant_number(ex)
            for _ in range(2000):
                if region in ("US", "CA"):
                    head = r.choice(NANP_AREAS[region])
                else:
                    head = nsn[:min(r.choice([1, 2, 2, 3]), len(nsn) - 5)]
                cand = head + "".join(r.choice(string.digits) for _ in range(len(nsn) - len(head)))
                if region in ("US", "CA") and (cand[3] in "01" or cand[3:6] == "555"):
                    continue
                try:
                    num = phonenumbers.parse("+" + str(ex.country_code) + cand)
                except phonenumbers.NumberParseException:
                    continue
                if phonenumbers.is_valid_number(num) and phonenumbers.region_code_for_number(num) == region:
                    return num
            raise RuntimeError(region)

        def render(num):
            intl = phonenumbers.format_number(num, PNF.INTERNATIONAL)
            nat = phonenumbers.format_number(num, PNF.NATIONAL)
            if style == "intl":
                return intl
            if style == "nat":
                return nat
            if style == "e164":
                return phonenumbers.format_number(num, PNF.E164)
            if style == "nbsp":
                return intl.replace(" ", NBSP)
            if style == "thin":
                return intl.replace(" ", r.choice([THIN, NNBSP]))
            if style == "dash":
                if region == "JP":
                    return nat.replace("-", HYPH)
                d = r.choice([NBHY, ENDASH])
                cc = "+" + str(num.country_code)
                return cc + " " + re.sub(r"[ \-]", d, intl[len(cc):].strip())
            if style == "trunk0":
                cc = "+" + str(num.country_code)
                rest = intl[len(cc):].lstrip()
                return f"{cc} (0) {rest}" if region == "GB" else f"{cc} (0){rest}"
            if style == "dots":
                if region in ("US", "CA"):
                    d = phonenumbers.national_significant_number(num)
                    return f"{d[:3]}.{d[3:6]}.{d[6:]}"
                return re.sub(r"[ \-]", ".", nat)
            if style == "slash":
                return nat.replace(" ", "/", 1)
            if style == "fw":
                return fullwidth(r.choice([intl, nat]))
            if style == "ext":
                base = r.choice([intl, nat])
                return base + r.choice([f" ext. {r.randint(100, 999)}", f" x{r.randint(10, 99)}",
                                        f" ext {r.randint(1000, 4999)}"])
            raise ValueError(style)

        def make_value():
            return render(make())

        v = self.fresh(make_value, key=lambda v: re.sub(r"\D", "", unicodedata.normalize("NFKC", v)))
        assert phone_valid(v, region), (v, region)
        self.meta.append(("phone", v, {"region": region, "style": style}))
        return v

    # ---- card
    def card(self, brand, sep):
        r = self.r
        if brand in ("", "*"):
            brand = r.choice(["visa", "visa", "mc", "mc2", "amex", "discover", "jcb", "diners"])
        if sep in ("", "*"):
            sep = r.choice(["space", "space", "space", "dash", "none", "dot", "nbsp", "nnbsp", "thin", "zwsp", "shy"])

        def make():
            if brand == "visa":
                prefix, length = "4", 16
            elif brand == "mc":
                prefix, length = str(r.randint(51, 55)), 16
            elif brand == "mc2":
                prefix, length = str(r.randint(2221, 2720)), 16
            elif brand == "amex":
                prefix, length = r.choice(["34", "37"]), 15
            elif brand == "discover":
                prefix, length = r.choice(["6011", str(r.randint(644, 649)), "65"]), 16
            elif brand == "jcb":
                prefix, length = str(r.randint(3528, 3589)), 16
            elif brand == "diners":
                prefix, length = r.choice(["36", str(r.randint(300, 305))]), 14
            else:
                raise ValueError(brand)
            body = prefix + "".join(r.choice(string.digits) for _ in range(length - 1 - len(prefix)))
            return body + luhn_digit(body)

        digits = self.fresh(make)
        assert luhn_ok(digits)
        if len(digits) == 15:
            groups = [digits[:4], digits[4:10], digits[10:]]
        elif len(digits) == 14:
            groups = [digits[:4], digits[4:10], digits[10:]]
        else:
            groups = [digits[i:i + 4] for i in range(0, 16, 4)]
        seps = {"space": " ", "dash": "-", "none": "", "dot": ".", "nbsp": NBSP, "nnbsp": NNBSP, "thin": THIN,
                "zwsp": ZWSP, "shy": SHY}
        if sep == "fw":
            v = fullwidth(" ".join(groups))
        elif sep == "fwnone":
            v = fullwidth("".join(groups))
        else:
            v = seps[sep].join(groups)
        self.meta.append(("card", v, {"brand": brand, "digits": digits}))
        return v

    # ---- iban
    def iban(self, cc, style):
        r = self.r
        if cc in ("", "*"):
            cc = r.choice(sorted(IBAN_BBAN) + IBAN_NATIONAL)
        if style in ("", "*"):
            style = r.choice(["grouped"] * 5 + ["compact", "compact", "lower", "dash", "nbsp", "thin", "shy"])

        def rand(n, kind="n"):
            alpha = {"n": string.digits, "a": string.ascii_uppercase, "c": UPDIG}[kind]
            return "".join(r.choice(alpha) for _ in range(n))

        def make():
            while True:
                if cc == "BE":
                    ten = rand(10)
                    c = int(ten) % 97 or 97
                    bban = ten + f"{c:02d}"
                elif cc == "ES":
                    bank_branch, acct = rand(8), rand(10)
                    bban = bank_branch + _es_dc("00" + bank_branch) + _es_dc(acct) + acct
                elif cc == "FR":
                    bank, branch, acct = r.choice(["30004", "30003", "20041", "10278", "30002", "11315"]), rand(5), rand(11)
                    bban = bank + branch + acct + _fr_key(bank, branch, acct)
                elif cc == "IT":
                    rest = r.choice(["03069", "02008", "05034", "01030", "05428"]) + rand(5) + rand(12)
                    bban = _it_cin(rest) + rest
                elif cc == "NO":
                    ten = rand(10)
                    c = _no_check(ten)
                    if c is None:
                        continue
                    bban = ten + c
                elif cc == "PT":
                    s19 = r.choice(["0002", "0035", "0033", "0010", "0007"]) + rand(15)
                    bban = s19 + _pt_check(s19)
                else:
                    parts = []
                    for spec in IBAN_BBAN[cc]:
                        if isinstance(spec, str):
                            parts.append(r.choice(spec[5:].split(",")) if spec.startswith("BANK:") else spec)
                        else:
                            parts.append(rand(*spec))
                    bban = "".join(parts)
                compact = cc + iban_check_digits(cc, bban) + bban
                if iban_compact_valid(compact):
                    return compact

        compact = self.fresh(make)
        groups = [compact[i:i + 4] for i in range(0, len(compact), 4)]
        if style == "grouped":
            v = " ".join(groups)
        elif style == "compact":
            v = compact
        elif style == "lower":
            v = r.choice([compact, " ".join(groups)]).lower()
        elif style == "dash":
            v = "-".join(groups)
        elif style == "nbsp":
            v = NBSP.join(groups)
        elif style == "thin":
            v = THIN.join(groups)
        elif style == "shy":
            base = r.choice([compact, " ".join(groups)])
            cut = r.randint(6, len(base) - 3)
            while base[cut - 1] == " " or base[cut] == " ":
                cut += 1
            v = base[:cut] + SHY + base[cut:]
        else:
            raise ValueError(style)
        self.meta.append(("iban", v, {"compact": compact}))
        return v

    # ---- ssn
    def ssn(self, style):
        r = self.r
        if style in ("", "*"):
            style = r.choice(["hyphen"] * 4 + ["space", "none", "nbsp", "nbhy", "endash", "fw"])

        def make():
            while True:
                area = r.randint(1, 899)
                if area == 666:
                    continue
                s = f"{area:03d}{r.randint(1, 99):02d}{r.randint(1, 9999):04d}"
                if std_ssn.is_valid(s):
                    return s

        s = self.fresh(make)
        a, g, n = s[:3], s[3:5], s[5:]
        sep = {"hyphen": "-", "space": " ", "none": "", "nbsp": NBSP, "nbhy": NBHY, "endash": ENDASH,
               "hyph": HYPH, "fw": "-"}[style]
        v = f"{a}{sep}{g}{sep}{n}"
        if style == "fw":
            v = fullwidth(v)
        self.meta.append(("national_id", v, {"digits": s}))
        return v

    # ---- ip
    def ip4(self, kind):
        r = self.r
        if kind in ("", "*"):
            kind = r.choice(["public", "public", "private", "doc"])

        def make():
            if kind == "private":
                b = r.choice(["10", "172", "192"])
                if b == "10":
                    return f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}"
                if b == "172":
                    return f"172.{r.randint(16, 31)}.{r.randint(0, 255)}.{r.randint(2, 254)}"
                return f"192.168.{r.randint(0, 255)}.{r.randint(2, 254)}"
            if kind == "doc":
                return f"{r.choice(['192.0.2', '198.51.100', '203.0.113'])}.{r.randint(2, 254)}"
            while True:
                a = ipaddress.IPv4Address(f"{r.randint(1, 223)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}")
                if a.is_global and not a.is_multicast:
                    return str(a)

        v = self.fresh(make)
        self.meta.append(("ip_address", v, {"kind": kind}))
        return v

    def ip6(self, kind):
        r = self.r
        if kind in ("", "*"):
            kind = r.choice(["global", "global", "full", "upper", "linklocal", "ula", "mapped"])

        def grp():
            return f"{r.randint(0, 0xffff):x}"

        def make():
            if kind in ("global", "full", "upper"):
                pre = r.choice(["2001:db8", "2a02:810d", "2600:1f18", "2a01:4f8", "2606:4700", "2401:4900",
                                "2a00:1450", "2001:470", "2a0e:97c0", "2804:14c"])
                shape = r.choice(["sparse", "sparse", "dense"])
                if shape == "sparse":
                    tail = [grp(), "0", "0", "0", grp(), grp()] if r.random() < 0.5 else ["0", "0", "0", "0", "0", grp()]
                else:
                    tail = [grp() for _ in range(6)]
                a = ipaddress.IPv6Address(pre + ":" + ":".join(tail))
                if kind == "full":
                    return a.exploded
                if kind == "upper":
                    return str(a).upper()
                return str(a)
            if kind == "linklocal":
                return str(ipaddress.IPv6Address(
                    f"fe80::{r.randint(0, 0xffff):x}:{r.randint(0, 0xff):x}ff:fe{r.randint(0, 0xff):02x}:{r.randint(0, 0xffff):x}"))
            if kind == "ula":
                return str(ipaddress.IPv6Address(f"fd{r.randint(0, 0xff):02x}:{grp()}:{grp()}:{grp()}::{grp()}"))
            if kind == "mapped":
                return "::ffff:" + self.r.choice([f"203.0.113.{r.randint(2, 254)}", f"198.51.100.{r.randint(2, 254)}",
                                                  f"{r.randint(11, 99)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}"])
            raise ValueError(kind)

        v = self.fresh(make, key=lambda v: v.lower())
        ipaddress.ip_address(v)
        self.meta.append(("ip_address", v, {"kind": kind}))
        return v

    # ---- passwords
    def password(self, lang, kind=""):
        r = self.r
        if kind in ("", "*"):
            kind = r.choice(["human", "human", "strong"])

        def make():
            if kind == "shell":
                return self.rs(1, string.ascii_letters) + self.rs(r.randint(9, 14), AN + "_.") + self.rs(1, AN)
            if kind == "url":
                return self.rs(1, AN) + self.rs(r.randint(12, 20), AN + "-_.~!*") + self.rs(1, AN)
            if kind == "strong":
                while True:
                    p = self.rs(1, AN) + self.rs(r.randint(12, 18), AN + PW_SYMS) + self.rs(1, AN)
                    if any(c.isupper() for c in p) and any(c.isdigit() for c in p) and any(c in PW_SYMS for c in p):
                        return p
            words = PW_WORDS.get(lang, PW_WORDS["en"])
            w1, w2 = r.sample(words, 2)
            pat = r.randint(0, 5)
            if pat == 0:
                return f"{w1}{r.randint(1990, 2026)}{r.choice('!#$%&*?')}{r.choice('xqzk')}"
            if pat == 1:
                return f"{w1}{r.choice('-_.#')}{w2}{r.randint(10, 99)}"
            if pat == 2:
                leet = w1.replace("a", "@").replace("o", "0").replace("e", "3").replace("i", "1")
                return f"{leet}{r.choice('#$%&')}{r.randint(100, 999)}"
            if pat == 3:
                return f"{w1.lower()}{r.randint(10, 99)}{w2.upper()}"
            if pat == 4:
                return f"{r.randint(1, 9)}{w1}{r.choice('!*+=')}{w2}"
            return f"{w1}{w2}{r.choice('!#')}{r.randint(1, 9)}{r.randint(1, 9)}"

        return self.fresh(make)

    # ---- credentials
    def cred(self, kind, lang):
        r = self.r
        rs, edge = self.rs, self.rs_edge

        def make():
            if kind == "aws_id":
                return "AKIA" + rs(16, string.ascii_uppercase + "234567")
            if kind == "aws_sts":
                return "ASIA" + rs(16, string.ascii_uppercase + "234567")
            if kind == "aws_secret":
                return edge(40, B64)
            if kind == "openai_proj":
                return "sk-proj-" + edge(r.choice([48, 74, 156]), B64URL)
            if kind == "openai_legacy":
                return "sk-" + rs(20) + "T3BlbkFJ" + rs(20)
            if kind == "anthropic":
                return "sk-ant-api03-" + rs(93, B64URL) + "AA"
            if kind in ("ghp", "gho", "ghs", "ghu"):
                return kind + "_" + rs(36)
            if kind == "github_pat":
                return "github_pat_11" + rs(20, UPDIG) + "_" + rs(59)
            if kind == "glpat":
                return "glpat-" + edge(20, B64URL)
            if kind == "xoxb":
                return f"xoxb-{self.digits(r.choice([11, 12]))}-{self.digits(13)}-{rs(24)}"
            if kind == "xoxp":
                return f"xoxp-{self.digits(12)}-{self.digits(12)}-{self.digits(13)}-{rs(32, '0123456789abcdef')}"
            if kind == "sk_live":
                return "sk_live_51" + rs(r.choice([24, 96]))
            if kind == "rk_live":
                return "rk_live_51" + rs(r.choice([24, 96]))
            if kind == "google":
                return "AIza" + edge(35, B64URL)
            if kind == "gocspx":
                return "GOCSPX-" + edge(28, B64URL)
            if kind == "sendgrid":
                return "SG." + edge(22, B64URL) + "." + edge(43, B64URL)
            if kind == "twilio_sk":
                return "SK" + rs(32, "0123456789abcdef")
            if kind == "twilio_secret":
                return rs(32)
            if kind == "npm":
                return "npm_" + rs(36)
            if kind == "pypi":
                return "pypi-AgEIcHlwaS5vcmc" + edge(r.randint(140, 170), B64URL)
            if kind == "hf":
                return "hf_" + rs(34, string.ascii_letters)
            if kind == "jwt":
                def b64u(b):
                    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
                head = b64u(json.dumps({"alg": r.choice(["HS256", "RS256"]), "typ": "JWT"}, separators=(",", ":")).encode())
                body = b64u(json.dumps({"sub": str(r.randint(10000, 99999999)), "iat": 1741600000 + r.randint(0, 99999),
                                        "exp": 1741700000 + r.randint(0, 99999),
                                        "scope": r.choice(["read", "orders:write", "admin"])},
                                       separators=(",", ":")).encode())
                sig = b64u(bytes(r.getrandbits(8) for _ in range(32 if "IUzI1NiIs" in head else 256)))
                return f"{head}.{body}.{sig}"
            if kind == "bearer":
                return edge(r.choice([40, 48, 64]), AN + "-._")
            if kind == "django":
                return "django-insecure-" + edge(50, string.ascii_lowercase + string.digits + "!#$%^&*(-_=+)") \
                    if r.random() < 0.3 else edge(50, string.ascii_lowercase + string.digits + "!#$%^&*(-_=+)")
            if kind == "hex32":
                return rs(32, "0123456789abcdef")
            if kind == "hex64":
                return rs(64, "0123456789abcdef")
            if kind == "b64secret":
                return base64.b64encode(bytes(r.getrandbits(8) for _ in range(r.choice([32, 48])))).decode()
            if kind == "wg":
                while True:
                    v = base64.b64encode(bytes(r.getrandbits(8) for _ in range(32))).decode()
                    if v[0].isalnum():
                        return v
            if kind == "ec_key":
                der = bytes.fromhex("30770201010420") + bytes(r.getrandbits(8) for _ in range(32)) + \
                    bytes.fromhex("a00a06082a8648ce3d030107a14403420004") + bytes(r.getrandbits(8) for _ in range(64))
                b = base64.b64encode(der).decode()
                lines = [b[i:i + 64] for i in range(0, len(b), 64)]
                return "-----BEGIN EC PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END EC PRIVATE KEY-----"
            if kind == "rsa_key":
                der = bytes.fromhex("308204bd020100300d06092a864886f70d0101010500048204a7308204a30201000282010100") + \
                    bytes(r.getrandbits(8) for _ in range(1160))
                b = base64.b64encode(der).decode()
                lines = [b[i:i + 64] for i in range(0, len(b), 64)]
                return "-----BEGIN PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END PRIVATE KEY-----"
            if kind in ("openssh_key", "openssh_split"):
                def sshstr(b):
                    return len(b).to_bytes(4, "big") + b
                pub = bytes(r.getrandbits(8) for _ in range(32))
                pubblob = sshstr(b"ssh-ed25519") + sshstr(pub)
                check = bytes(r.getrandbits(8) for _ in range(4))
                priv = check + check + pubblob + sshstr(bytes(r.getrandbits(8) for _ in range(32)) + pub) + \
                    sshstr(f"{r.choice(['deploy', 'ci', 'backup'])}@{r.choice(['runner-02', 'build', 'nas'])}".encode()) + \
                    bytes(range(1, 8))
                blob = b"openssh-key-v1\x00" + sshstr(b"none") + sshstr(b"none") + sshstr(b"") + \
                    (1).to_bytes(4, "big") + sshstr(pubblob) + sshstr(priv)
                b = base64.b64encode(blob).decode()
                lines = [b[i:i + 70] for i in range(0, len(b), 70)]
                head = "-----BEGIN OPENSSH PRIVATE KEY-----" if kind == "openssh_key" else \
                    "-----BEGIN OPENSSH PRIVATE\nKEY-----"
                return head + "\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----"
            if kind.startswith("basic="):
                user = kind.split("=", 1)[1]
                return base64.b64encode(f"{user}:{self.password(lang, 'strong')}".encode()).decode()
            if kind.startswith("url="):
                tpl = kind.split("=", 1)[1]
                return (tpl.replace("{PW}", self.password(lang, "url"))
                        .replace("{PWAT}", self.password(lang, "url")[:6] + "@" + self.password(lang, "url")[:6])
                        .replace("{GLPAT}", "glpat-" + edge(20, B64URL))
                        .replace("{GHS}", "ghs_" + rs(36)))
            raise ValueError(kind)

        v = self.fresh(make)
        self.meta.append(("credential", v, {"kind": kind.split("=")[0]}))
        return v

    # ---- unlabelled fillers
    def filler(self, kind, arg, ctx):
        r = self.r
        if kind in ("first", "last", "full", "flow", "llow"):
            p = ctx.person(int(arg or 0))
            if kind == "first":
                return p["first"]
            if kind == "last":
                return p["last"]
            if kind == "flow":
                return re.sub(r"[^a-z]", "", p["rf"].lower())
            if kind == "llow":
                return re.sub(r"[^a-z]", "", p["rl"].lower())
            if ctx.lang in ("ja", "zh"):
                return p["last"] + p["first"]
            return f"{p['first']} {p['last']}"
        if kind in ("d", "d0"):
            while True:  # long digit runs never pass Luhn, so they cannot pass for a card
                v = self.digits(int(arg), lead_zero=kind == "d0")
                if not (13 <= len(v) <= 19 and luhn_ok(v)):
                    return v
        if kind == "fwd0":
            return fullwidth(self.digits(int(arg), lead_zero=True))
        if kind == "dd":
            a, b = arg.split("-")
            return str(r.randint(int(a), int(b)))
        if kind == "lhex":
            return self.rs(int(arg), "0123456789abcdef")
        if kind == "uhex":
            return self.rs(int(arg), "0123456789ABCDEF")
        if kind == "AN":
            return self.rs(int(arg), UPDIG)
        if kind == "an":
            return self.rs(int(arg), LODIG)
        if kind == "A":
            return self.rs(int(arg), string.ascii_uppercase)
        if kind == "uuid":
            h = self.rs(32, "0123456789abcdef")
            h = h[:12] + "4" + h[13:16] + r.choice("89ab") + h[17:]
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        if kind == "b64":
            return self.rs(int(arg), B64)
        if kind == "b64key":
            return base64.b64encode(bytes(r.getrandbits(8) for _ in range(32))).decode()
        if kind == "mac":
            return ":".join(f"{r.randint(0, 255):02x}" for _ in range(6))
        if kind == "colonhex":
            return ":".join(f"{r.randint(0, 255):02X}" for _ in range(int(arg)))
        if kind == "imei":
            body = r.choice(["35", "86", "01", "35"]) + self.rs(12, string.digits)
            v = body + luhn_digit(body)
            assert len(v) == 15 and luhn_ok(v)
            return v
        if kind == "ean13":
            body = r.choice(["400", "401", "590", "760", "800", "871", "978", "300"]) + self.rs(9, string.digits)
            return body + _gtin_check(body)
        if kind == "gtin14":
            body = "1" + r.choice(["400", "590", "871"]) + self.rs(9, string.digits)
            return body + _gtin_check(body)
        if kind == "upca":
            body = "0" + self.rs(10, string.digits)
            return body + _gtin_check(body)
        if kind == "isbn13":
            body = "978" + r.choice(["3", "0", "1", "2", "84", "88"])
            body += self.rs(12 - len(body), string.digits)
            d = body + _gtin_check(body)
            return f"{d[:3]}-{d[3]}-{d[4:8]}-{d[8:12]}-{d[12]}"
        if kind == "isbn10":
            body = r.choice(["0", "3", "2"]) + self.rs(8, string.digits)
            s = sum((10 - i) * int(c) for i, c in enumerate(body))
            c = (11 - s % 11) % 11
            d = body + ("X" if c == 10 else str(c))
            return f"{d[0]}-{d[1:4]}-{d[4:9]}-{d[9]}"
        if kind == "aba":
            while True:
                b = f"{r.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 21, 22, 26, 31]):02d}" + self.rs(6, string.digits)
                for c in range(10):
                    d = b + str(c)
                    w = [3, 7, 1] * 3
                    if sum(int(x) * y for x, y in zip(d, w)) % 10 == 0:
                        return d
        if kind == "ein":
            return f"{r.choice([12, 20, 27, 45, 46, 47, 81, 84, 94])}-{self.rs(7, string.digits)}"
        if kind == "badcard":
            while True:
                v = r.choice(["4", "5", "6011", "37"]) + self.rs(15, string.digits)
                v = v[:16]
                if not luhn_ok(v):
                    return v
        if kind == "badiban":
            while True:
                cc = arg or "DE"
                v = cc + self.rs(2, string.digits) + self.rs(18, string.digits)
                if not iban_mod97_ok(v):
                    return " ".join(v[i:i + 4] for i in range(0, len(v), 4))
        if kind == "badssn":
            area = r.choice(["000", "666", str(r.randint(900, 999))])
            return f"{area}-{r.randint(10, 99)}-{r.randint(1000, 9999)}"
        if kind == "ups":
            return "1Z" + self.rs(6, UPDIG) + self.rs(10, string.digits)
        if kind == "bic":
            bics = {"DE": ["COBADEFFXXX", "DEUTDEFF500", "GENODEF1S04", "PBNKDEFF"], "GB": ["NWBKGB2L", "BARCGB22",
                    "LOYDGB2L", "HBUKGB4B"]}
            return r.choice(bics.get(arg) or ["BNPAFRPPXXX", "INGBNL2A", "UNCRITMM", "CAIXESBBXXX", "RABONL2U",
                                               "PKOPPLPW", "TGBATRIS", "NBEGEGCX"])
        if kind == "b64bytes":
            return base64.b64encode(bytes(r.getrandbits(8) for _ in range(int(arg)))).decode()
        if kind == "ecpub":
            der = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d03010703420004") + \
                bytes(r.getrandbits(8) for _ in range(64))
            b = base64.b64encode(der).decode()
            return "\n".join(b[i:i + 64] for i in range(0, len(b), 64))
        if kind == "v4":
            return ".".join(str(x) for x in (r.randint(1, 12), r.randint(0, 20), r.randint(0, 9), r.randint(1, 250)))
        if kind == "pick":
            return r.choice(arg.split("|"))
        raise ValueError(kind)


def _gtin_check(body: str) -> str:
    s = 0
    for i, c in enumerate(reversed(body)):
        s += int(c) * (3 if i % 2 == 0 else 1)
    return str((10 - s % 10) % 10)


class Ctx:
    def __init__(self, gen: Gen, lang: str):
        self.gen, self.lang, self.people, self.refs = gen, lang, {}, {}

    def person(self, i):
        if i not in self.people:
            while True:
                p = self.gen.person(self.lang)
                if all(p["first"] != q["first"] for q in self.people.values()):
                    break
            self.people[i] = p
        return self.people[i]


PH = re.compile(r"⟦([^⟦⟧]*)⟧")
LABEL_KINDS = {"email", "phone", "card", "iban", "ssn", "ip4", "ip6", "cred", "pw"}
KIND_ENTITY = {"email": "email", "phone": "phone", "card": "card", "iban": "iban", "ssn": "national_id",
               "ip4": "ip_address", "ip6": "ip_address", "cred": "credential", "pw": "credential"}


def render(gen: Gen, lang: str, template: str):
    ctx = Ctx(gen, lang)
    parts: list = []
    pos = 0
    for m in PH.finditer(template):
        if m.start() > pos:
            parts.append(template[pos:m.start()])
        pos = m.end()
        spec = m.group(1)
        if spec.startswith("="):
            ent, val = ctx.refs[spec[1:]]
            parts.append(Label(ent, val))
            continue
        store = None
        sm = re.search(r"#(\w+)$", spec)
        if sm:
            store, spec = sm.group(1), spec[:sm.start()]
        if spec.startswith("pick:"):
            parts.append(gen.filler("pick", spec[5:], ctx))
            continue
        if spec.startswith("cred:"):
            kind, args = "cred", [spec[5:]]
        else:
            kind, *args = spec.split(":")
        if kind in LABEL_KINDS:
            a = args + ["", "", ""]
            if kind == "email":
                v = gen.email(lang, a[0], ctx.person(int(a[1] or 0)))
            elif kind == "phone":
                v = gen.phone(lang, a[0], a[1])
            elif kind == "card":
                v = gen.card(a[0], a[1])
            elif kind == "iban":
                v = gen.iban(a[0], a[1])
            elif kind == "ssn":
                v = gen.ssn(a[0])
            elif kind == "ip4":
                v = gen.ip4(a[0])
            elif kind == "ip6":
                v = gen.ip6(a[0])
            elif kind == "pw":
                v = gen.password(lang, a[0] if a[0] in ("strong", "human", "shell", "url") else "")
                gen.meta.append(("credential", v, {"kind": "password"}))
            else:
                v = gen.cred(a[0], lang)
            lab = Label(KIND_ENTITY[kind], v)
            if store:
                ctx.refs[store] = (lab.entity, v)
            parts.append(lab)
        else:
            parts.append(gen.filler(kind, args[0] if args else "", ctx))
    if pos < len(template):
        parts.append(template[pos:])
    return parts


def assemble(parts, nfd=False):
    text, labels = "", []
    for p in parts:
        if isinstance(p, Label):
            v = unicodedata.normalize("NFD", p.value) if nfd else p.value
            labels.append({"entity": p.entity, "value": v, "start": len(text)})
            text += v
        else:
            text += unicodedata.normalize("NFD", p) if nfd else p
    return text, labels


# --------------------------------------------------------------------------
# Templates with labelled values
# --------------------------------------------------------------------------

POS = [
    # ---------------- English: e-mail, chat, helpdesk, CRM, logs, configs
    ("en", "Ticket #⟦d:6⟧ — caller ⟦full⟧ verified identity with full SSN ⟦ssn:hyphen⟧ and the last four digits of the "
           "card on file. MFA reset done, no further action."),
    ("en", "# staging\nAPP_ENV=staging\nDATABASE_URL=⟦cred:url=postgres://app_user:{PW}@db-staging.internal:5432/app⟧\n"
           "DB_PASSWORD=⟦pw:strong⟧\nSECRET_KEY=⟦cred:django⟧\nSTRIPE_SECRET_KEY=⟦cred:sk_live⟧\nSTRIPE_RESTRICTED_KEY=⟦cred:rk_live⟧\nLOG_LEVEL=info\nFEATURE_FLAGS=checkout_v2,dark_mode"),
    ("en", "⟦ip4:public⟧ - - [11/Mar/2026:06:25:14 +0000] \"GET /api/v2/items?page=3 HTTP/1.1\" 200 5123 \"-\" "
           "\"Mozilla/5.0 (X11; Linux x86_64)\"\n⟦ip4:public⟧ - - [11/Mar/2026:06:25:15 +0000] \"POST /login HTTP/1.1\" "
           "302 0 \"-\" \"curl/8.5.0\""),
    ("en", "Mar 11 03:12:44 bastion sshd[48213]: Failed password for invalid user admin from ⟦ip4:public⟧ port 52113 ssh2\n"
           "Mar 11 03:12:51 bastion sshd[48219]: Accepted publickey for deploy from ⟦ip6:global⟧ port 40022 ssh2: "
           "ED25519 SHA256:⟦b64:43⟧"),
    ("en", "employee_id,name,ssn,work_email,phone\nE⟦d:5⟧,⟦full:0⟧,⟦ssn:hyphen⟧,⟦email:plain:0⟧,⟦phone:US:nat⟧\n"
           "E⟦d:5⟧,⟦full:1⟧,⟦ssn:none⟧,⟦email:plain:1⟧,⟦phone:US:e164⟧\n"
           "E⟦d:5⟧,⟦full:2⟧,⟦ssn:hyphen⟧,⟦email:plain:2⟧,⟦phone:US:intl⟧"),
    ("en", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s3-uploader\n  namespace: media\ntype: Opaque\nstringData:\n"
           "  AWS_ACCESS_KEY_ID: ⟦cred:aws_id⟧\n  AWS_SECRET_ACCESS_KEY: ⟦cred:aws_secret⟧\n  AWS_REGION: eu-central-1"),
    ("en", "{\"web\":{\"client_id\":\"⟦d:12⟧-⟦an:32⟧.apps.googleusercontent.com\",\"project_id\":\"billing-⟦d:6⟧\","
           "\"auth_uri\":\"https://accounts.google.com/o/oauth2/auth\",\"client_secret\":\"⟦cred:gocspx⟧\","
           "\"redirect_uris\":[\"https://app.example.com/oauth2/callback\"]}}"),
    ("en", "  501  export GITHUB_TOKEN=⟦cred:ghp⟧\n  502  gh repo clone acme/infra\n  503  mysql -u root -p⟦pw:shell⟧ "
           "-h ⟦ip4:private⟧ inventory\n  504  curl -s -H \"Authorization: Bearer ⟦cred:bearer⟧\" "
           "https://api.example.net/v1/me | jq .\n  505  history | tail"),
    ("en", "$ git remote -v\norigin\t⟦cred:url=https://oauth2:{GLPAT}@gitlab.example.com/platform/payments.git#g⟧ (fetch)\n"
           "origin\t⟦=g⟧ (push)"),
    ("en", "from openai import OpenAI\n\nclient = OpenAI(api_key=\"⟦cred:openai_proj⟧\")\n"
           "resp = client.responses.create(model=\"gpt-4.1-mini\", input=\"ping\")\n\nimport anthropic\n"
           "# TODO move both keys to the vault before merging!!\n"
           "claude = anthropic.Anthropic(api_key=\"⟦cred:anthropic⟧\")"),
    ("en", "GET /admin/metrics HTTP/1.1\nHost: ⟦ip4:private⟧:9090\nAuthorization: Basic ⟦cred:basic=admin⟧\n"
           "User-Agent: Prometheus/2.51.0\nAccept: */*"),
    ("en", "Hi, the vendor asked for our signing key for the webhook integration, so I'm pasting it here:\n\n⟦cred:ec_key⟧\n\n"
           "Let me know if it works on your side. — ⟦first⟧"),
    ("en", "On Tue, ⟦full⟧ wrote:\nhere's the deploy key for the new runner, the terminal wrapped the header, sorry\n\n"
           "⟦cred:openssh_split⟧\n\nplease delete after copying"),
    ("en", "INVOICE ⟦pick:INV|SI|BL⟧-2026-⟦d:5⟧\nAmount due: £1,480.00 by 31 March 2026\nPay by bank transfer to "
           "⟦pick:Hollis & Grant Ltd|Kestrel Print Ltd|Oakridge Joinery Ltd⟧\nIBAN: ⟦iban:GB:grouped⟧   BIC: ⟦bic:GB⟧\n"
           "VAT reg. GB⟦d:9⟧"),
    ("en", "Hi ⟦first⟧, your Greenway Dental appt is Thu 12 Mar at 9:40am. Reply C to confirm or call ⟦phone:AU:nat⟧ "
           "to reschedule. Txt STOP to opt out"),
    ("en", "Anyone else getting calls from ⟦phone:US:dots⟧? Says it's about my car's \"extended warranty\", hangs up as soon "
           "as I ask for the company name. Reported it already."),
    ("en", "contact_id;full_name;email;phone;iban;segment\n⟦d:7⟧;⟦full:0⟧;⟦email:plain:0⟧;⟦phone:DE:intl⟧;"
           "⟦iban:DE:compact⟧;B2C\n⟦d:7⟧;⟦full:1⟧;⟦email:upper:1⟧;⟦phone:NL:intl⟧;⟦iban:NL:compact⟧;B2B"),
    ("en", "services:\n  db:\n    image: postgres:16.2\n    environment:\n      POSTGRES_USER: orders\n"
           "      POSTGRES_PASSWORD: ⟦pw:strong⟧\n    networks:\n      backend:\n        ipv4_address: ⟦ip4:private⟧\n"
           "  api:\n    image: acme/orders-api:3.4.0.12"),
    ("en", "In [1]: import os\nIn [2]: os.environ[\"OPENAI_API_KEY\"] = \"⟦cred:openai_legacy⟧\"\n"
           "In [3]: from huggingface_hub import login\nIn [4]: login(token=\"⟦cred:hf⟧\")\n"
           "Token is valid (permission: write).\nYour token has been saved to /home/⟦flow⟧/.cache/huggingface/token"),
    ("en", "$ cat ~/.pypirc\n[pypi]\nusername = __token__\npassword = ⟦cred:pypi⟧\n$ cat ~/.npmrc\n"
           "//registry.npmjs.org/:_authToken=⟦cred:npm⟧\n@acme:registry=https://npm.pkg.github.com\n"
           "//npm.pkg.github.com/:_authToken=⟦cred:ghp⟧\nalways-auth=true"),
    ("en", "TWILIO_ACCOUNT_SID=AC⟦lhex:32⟧\nTWILIO_API_KEY=⟦cred:twilio_sk⟧\nTWILIO_API_SECRET=⟦cred:twilio_secret⟧"),
    ("en", "mail:\n  provider: sendgrid\n  api_key: ⟦cred:sendgrid⟧\n  from: ⟦email:role⟧\n  reply_to: ⟦email:plain⟧"),
    ("en", "<script async\n  src=\"https://maps.googleapis.com/maps/api/js?key=⟦cred:google⟧&callback=initMap&v=weekly\">\n"
           "</script>"),
    ("en", "Run actions/checkout@v4\n  with:\n    repository: acme/billing\n    token: ⟦cred:github_pat⟧\n"
           "    fetch-depth: 0\nSyncing repository: acme/billing"),
    ("en", "2026-03-11T09:14:07.220Z DEBUG http.client outgoing headers={'Authorization': 'Bearer ⟦cred:jwt⟧', "
           "'Accept': 'application/json', 'X-Request-Id': '⟦uuid⟧'}"),
    ("en", "Mar 11 04:40:02 fw01 kernel: [UFW BLOCK] IN=eth0 OUT= MAC=⟦mac⟧:⟦mac⟧:86:dd SRC=⟦ip6:global⟧ "
           "DST=⟦ip6:full⟧ LEN=80 TC=0 HOPLIMIT=54 PROTO=TCP SPT=51820 DPT=22 WINDOW=64800 SYN"),
    ("en", "network:\n  version: 2\n  ethernets:\n    ens3:\n      dhcp4: true\n      gateway6: ⟦ip6:global⟧\n"
           "      nameservers:\n        addresses: [⟦ip4:public⟧, ⟦ip6:global⟧]"),
    ("en", "WARN  RateLimiter - client ⟦ip6:mapped⟧ exceeded 120 req/min on /api/search (bucket=⟦uuid⟧, window=60s)"),
    ("en", "$ ip -6 neigh show\n⟦ip6:linklocal⟧ dev eth0 lladdr ⟦mac⟧ router REACHABLE\n"
           "⟦ip6:ula⟧ dev eth0 lladdr ⟦mac⟧ STALE"),
    ("en", "Change CHG-⟦d:7⟧ approved. Allowed management host: ⟦ip6:upper⟧ (jump box in rack 4, "
           "firmware 2.4.1.9)."),
    ("en", "Mar 11 07:01:33 mx1 postfix/smtpd[2231]: connect from unknown[⟦ip4:public⟧]\n"
           "Mar 11 07:01:34 mx1 postfix/qmgr[1180]: 4F2A81C0E: from=<⟦email:plain⟧>, size=18342, nrcpt=1 (queue active)\n"
           "Mar 11 07:01:35 mx1 postfix/smtp[2240]: 4F2A81C0E: to=<⟦email:role⟧>, relay=none, status=deferred"),
    ("en", "Name:         checkout-7d9f8c6b5-x2lqp\nNamespace:    shop\nNode:         worker-3/⟦ip4:private⟧\n"
           "Status:       Running\nIP:           ⟦ip4:private⟧\nContainers:\n  app:\n"
           "    Image:      registry.example.com/shop/checkout:1.14.2.7"),
    ("en", "An account failed to log on.\n\nLogon Type:\t\t\t3\nFailure Reason:\t\tUnknown user name or bad password.\n"
           "Network Information:\n\tWorkstation Name:\tDESKTOP-⟦AN:7⟧\n\tSource Network Address:\t⟦ip4:private⟧\n"
           "\tSource Port:\t\t⟦dd:49152-65535⟧"),
    ("en", "[Interface]\nPrivateKey = ⟦cred:wg⟧\nDNS = ⟦ip4:private⟧\n\n[Peer]\nPublicKey = ⟦b64key⟧\n"
           "Endpoint = ⟦ip4:public⟧:51820\nPersistentKeepalive = 25"),
    ("en", "CELERY_BROKER_URL=⟦cred:url=redis://:{PW}@cache-01.internal:6379/0⟧\nMONGO_URI=\"⟦cred:url=mongodb+srv://reporting:{PWAT}@cluster0.ab1cd.mongodb.net/analytics⟧\"\n"
           "# password has an @ in it, the driver complains but it works locally"),
    ("en", "--\n⟦full⟧ | Accounts Receivable\nT ⟦phone:US:ext⟧ | M ⟦phone:US:intl⟧\n⟦email:plain⟧"),
    ("en", "Regional contacts\n- Dublin: ⟦phone:IE:intl⟧\n- Johannesburg: ⟦phone:ZA:intl⟧\n- Singapore: ⟦phone:SG:intl⟧\n"
           "- Lagos: ⟦phone:NG:intl⟧\n- Auckland: ⟦phone:NZ:intl⟧\n- Toronto: ⟦phone:CA:*⟧\n"
           "- Buenos Aires: ⟦phone:AR:intl⟧\n- Bogotá: ⟦phone:CO:intl⟧\n- Taipei: ⟦phone:TW:intl⟧"),
    ("en", "Nordic support lines — Stockholm ⟦phone:SE:intl⟧, Oslo ⟦phone:NO:intl⟧, Copenhagen ⟦phone:DK:intl⟧, "
           "Helsinki ⟦phone:FI:intl⟧.\nField sales: Seoul ⟦phone:KR:intl⟧ · Prague ⟦phone:CZ:intl⟧ · "
           "Athens ⟦phone:GR:intl⟧"),
    ("en", "Customer: ok the card is ⟦card:amex:space⟧ exp 08/29\nAgent: Thanks. Please never send the security code "
           "in chat, I'll call you for that."),
    ("en", "Payment method: Discover\nCard number: ⟦card:discover:dash⟧\nName on card: ⟦full⟧\nBilling ZIP: ⟦d:5⟧"),
    ("en", "2026-03-11 10:22:01,557 ERROR gateway.adapter: declined pan=⟦card:visa:none⟧ reason=51 amount=129.90 "
           "currency=USD merchant=⟦d:9⟧"),
    ("en", "Here's my card so you can sort out the double charge: ⟦card:mc:zwsp⟧. It's under ⟦full⟧."),
    ("en", "Form W-9 (Rev. March 2024)\nPart I  Taxpayer Identification Number (TIN)\nSocial security number: ⟦ssn:space⟧\n"
           "Employer identification number: —"),
    ("en", "{\"applicant\": {\"name\": \"⟦full⟧\", \"ssn\": \"⟦ssn:none⟧\", \"dob\": \"1987-06-14\", "
           "\"annual_income\": 84000, \"email\": \"⟦email:plain⟧\"}}"),
    ("en", "audit: lookup by key SSN⟦ssn:none⟧ returned 1 row (user=hr-svc, took 12ms)"),
    ("en", "ok my ssn is ⟦ssn:endash⟧ sorry had to dig the card out lol"),
    ("en", "New hire setup: your laptop login is your employee ID, temporary password ⟦pw⟧ — you'll be asked to change "
           "it at first sign-in."),
    ("en", "SLACK_BOT_TOKEN=⟦cred:xoxb⟧\nSLACK_SIGNING_SECRET=⟦cred:hex32⟧\nSLACK_USER_TOKEN=⟦cred:xoxp⟧\nSLACK_APP_ID=A0⟦AN:9⟧"),
    ("en", "botocore.exceptions.ClientError: An error occurred (AccessDenied) when calling the GetObject operation\n"
           "  session creds: access_key=⟦cred:aws_sts⟧ secret_key=⟦cred:aws_secret⟧ region=us-east-1"),
    ("en", "$ cat ~/.config/gh/hosts.yml\ngithub.com:\n    user: ⟦flow⟧⟦llow⟧\n    oauth_token: ⟦cred:gho⟧\n"
           "    git_protocol: https\n$ git clone ⟦cred:url=https://x-access-token:{GHS}@github.com/acme/app.git⟧ src\n"
           "Cloning into 'src'..."),
    ("en", "Security incident summary: a login from ⟦ip4:public⟧ changed the recovery e-mail to ⟦email:plain⟧ and the "
           "phone number to ⟦phone:GB:intl⟧ at 02:14 UTC."),
    ("en", "Supplier bank details (AP master data)\n| Supplier | Country | IBAN |\n|---|---|---|\n| ⟦d:6⟧ | AT | "
           "⟦iban:AT:grouped⟧ |\n| ⟦d:6⟧ | LU | ⟦iban:LU:grouped⟧ |\n| ⟦d:6⟧ | CZ | ⟦iban:CZ:compact⟧ |\n| ⟦d:6⟧ | "
           "DK | ⟦iban:DK:grouped⟧ |\n| ⟦d:6⟧ | NO | ⟦iban:NO:grouped⟧ |"),
    ("en", "Refund request #⟦d:5⟧: please send €84.20 to ⟦iban:IE:grouped⟧ (account holder ⟦full⟧). "
           "Alt. account ⟦iban:FI:lower⟧."),
    ("en", "Wire instructions for the Athens office: IBAN ⟦iban:GR:grouped⟧, beneficiary ⟦pick:Aegean Tiles S.A.|"
           "Kyma Logistics S.A.⟧; for Vilnius: ⟦iban:LT:grouped⟧. For Tallinn: ⟦iban:EE:dash⟧. For Reykjavík: ⟦iban:IS:grouped⟧."),
    ("en", "Hey! My SSN is ⟦ssn:*⟧, could you double-check it on the I-9? HR said it was wrong."),
    ("en", "PAYROLL_EXPORT_2026_03.csv\nemp;ssn;net_pay\n⟦d:4⟧;⟦ssn:hyphen⟧;3,412.55\n⟦d:4⟧;⟦ssn:hyphen⟧;2,987.10\n"
           "⟦d:4⟧;⟦ssn:space⟧;4,105.00\n⟦d:4⟧;⟦ssn:none⟧;3,050.75"),
    ("en", "Tax preparer worksheet — 2025 return\nTaxpayer: ⟦full:0⟧   SSN ⟦ssn:hyphen⟧\nSpouse: ⟦full:1⟧   SSN "
           "⟦ssn:hyphen⟧\nDependent: ⟦first:2⟧   SSN ⟦ssn:space⟧\nRefund: direct deposit, routing ⟦aba⟧"),
    ("en", "Background screening order #BG-⟦d:6⟧\nCandidate: ⟦full⟧\nSSN provided: ⟦ssn:hyphen⟧\nSSN on credit header: "
           "⟦ssn:hyphen⟧ (mismatch, please confirm)\nNotify: ⟦email:plain⟧"),
    ("en", "INSERT INTO employees (id, name, ssn, email) VALUES\n  (⟦d:4⟧, '⟦full:0⟧', '⟦ssn:hyphen⟧', "
           "'⟦email:plain:0⟧'),\n  (⟦d:4⟧, '⟦full:1⟧', '⟦ssn:*⟧', '⟦email:plain:1⟧');"),
    ("en", "dependent,relationship,dob,ssn\n⟦first:1⟧,child,2014-05-02,⟦ssn:hyphen⟧\n⟦first:2⟧,child,2017-11-19,"
           "⟦ssn:hyphen⟧\n⟦first:3⟧,spouse,1986-02-27,⟦ssn:none⟧"),
    ("en", "Re: Claim CLM-⟦d:7⟧\n\nHello, attaching the form again. Policyholder SSN ⟦ssn:*⟧, spouse ⟦ssn:*⟧. "
           "Best number to reach me is ⟦phone:US:*⟧.\n\n⟦full⟧"),
    ("en", "{\"event\":\"kyc.submitted\",\"user\":⟦d:7⟧,\"tax_id_type\":\"SSN\",\"tax_id\":\"⟦ssn:none⟧\","
           "\"email\":\"⟦email:plain⟧\",\"client_ip\":\"⟦ip4:public⟧\",\"ua\":\"Mozilla/5.0\"}"),
    ("en", "Patient intake — ⟦full⟧, DOB 04/17/1979\nInsurance member ID W⟦d:9⟧, group ⟦d:6⟧\nSSN (billing only): "
           "⟦ssn:*⟧\nCard on file for copays: ⟦card:*:space⟧\nPreferred phone: ⟦phone:US:*⟧"),
    ("en", "Voicemail (transcribed) 11 Mar 16:42: \"Hi, this is ⟦first⟧ about my tax return, my social is ⟦ssn:space⟧, "
           "call me back at ⟦phone:US:nat⟧, thanks.\""),
    ("en", "INSERT INTO payments (id, pan, exp, email) VALUES\n  (⟦d:5⟧, '⟦card:*:none⟧', '0828', '⟦email:plain:0⟧'),\n"
           "  (⟦d:5⟧, '⟦card:*:none⟧', '1127', '⟦email:plain:1⟧'),\n  (⟦d:5⟧, '⟦card:*:none⟧', '0329', "
           "'⟦email:plain:2⟧');"),
    ("en", "Phone order #⟦d:6⟧ — customer read the card as ⟦card:amex:space⟧, declined; second card ⟦card:mc:space⟧ "
           "approved for $412.80. Receipt to ⟦email:*⟧."),
    ("en", "{\"level\":\"debug\",\"msg\":\"charge request\",\"card\":{\"number\":\"⟦card:*:none⟧\",\"exp\":\"09/28\"},"
           "\"billing_email\":\"⟦email:plain⟧\",\"remote_ip\":\"⟦ip6:*⟧\"}"),
    ("en", "Folio ⟦d:7⟧ · Guest ⟦full⟧ · Guarantee card ⟦card:amex:dash⟧ · Mobile ⟦phone:*:intl⟧ · Rate code BAR · "
           "No-show policy applies"),
    ("en", "<Dbtr><Nm>⟦full⟧</Nm></Dbtr>\n<DbtrAcct><Id><IBAN>⟦iban:*:compact⟧</IBAN></Id></DbtrAcct>\n"
           "<Cdtr><Nm>Stadtwerke Nord GmbH</Nm></Cdtr>\n<CdtrAcct><Id><IBAN>⟦iban:*:compact⟧</IBAN></Id></CdtrAcct>\n"
           "<RmtInf><Ustrd>Abschlag 03/2026 Vertrag ⟦d:9⟧</Ustrd></RmtInf>"),
    ("en", "commit ⟦lhex:40⟧\nAuthor: ⟦full:0⟧ <⟦email:plain:0#a⟧>\nDate:   Tue Mar 10 18:02:11 2026 -0500\n\n"
           "    Fix rounding in invoice totals\n\n    Signed-off-by: ⟦full:0⟧ <⟦=a⟧>\n"
           "    Reviewed-by: ⟦full:1⟧ <⟦email:*:1⟧>"),
    ("en", "2026/03/11 05:12:09 [error] 1207#1207: *48213 upstream timed out (110: Connection timed out) while reading "
           "response header from upstream, client: ⟦ip4:public⟧, server: shop.example.com, request: \"GET /cart "
           "HTTP/2.0\", upstream: \"http://[⟦ip6:ula⟧]:8080/cart\", host: \"shop.example.com\""),
    ("en", "<p>Questions about your booking? Write to <a href=\"mailto:⟦email:role#m⟧\">⟦=m⟧</a> or call "
           "⟦phone:GB:*⟧.</p>"),
    # ---------------- German
    ("de", "Sehr geehrte Damen und Herren,\n\nbitte ziehen Sie die Beiträge ab April von meinem neuen Konto ein: "
           "IBAN ⟦iban:DE:grouped⟧.\nFür Rückfragen erreichen Sie mich unter ⟦phone:DE:trunk0⟧.\n\n"
           "Mit freundlichen Grüßen\n⟦full⟧"),
    ("de", "Rechnung Nr. RE-2026-⟦d:5⟧\nBetrag: 1.249,00 €, zahlbar bis 25.03.2026\nBitte überweisen Sie auf "
           "IBAN ⟦iban:DE:nbsp⟧ (BIC ⟦bic:DE⟧) unter Angabe der Rechnungsnummer."),
    ("de", "Erinnerung: Ihr Termin in der Praxis Dr. ⟦last⟧ ist am Donnerstag, 12.03., um 08:30 Uhr. Falls Sie "
           "verhindert sind, sagen Sie bitte unter ⟦phone:AT:*⟧ ab."),
    ("de", "Impressum\n⟦full⟧, Steuerberatung\nTel.: ⟦phone:DE:slash⟧\nE-Mail: ⟦email:obf2⟧\nUSt-IdNr.: DE⟦d:9⟧"),
    ("de", "Für den Antrag benötigen wir noch Ihre US-Sozialversicherungsnummer. Angegeben haben Sie ⟦ssn:nbsp⟧ – "
           "bitte prüfen Sie die Ziffern."),
    ("de", "Kreditkarte (Mastercard): ⟦card:mc2:space⟧, gültig bis 11/27, Inhaber ⟦full⟧"),
    ("de", "Grüezi, meine Kontoverbindung für die Rückerstattung: ⟦iban:CH:grouped⟧. Telefon ⟦phone:CH:*⟧."),
    ("de", "Notiz 11.03. 14:20 – Kunde ⟦full⟧ ruft an, kommt nicht ins Portal. Neues Einmalpasswort ⟦pw:strong⟧ "
           "telefonisch durchgegeben, Rückruf bitte unter ⟦phone:DE:nat⟧."),
    ("de", "Der Datenbankserver ⟦ip4:private⟧ antwortet seit heute Nacht nicht mehr, der Failover auf "
           "⟦ip4:private⟧ hat nicht gegriffen. Ticket an die Nachtschicht."),
    # ---------------- French
    ("fr", "Bonjour,\nvoici mon RIB pour le remboursement : IBAN ⟦iban:FR:grouped⟧.\nVous pouvez me joindre au "
           "⟦phone:FR:dots⟧.\nCordialement,\n⟦full⟧"),
    ("fr", "Votre colis n° ⟦d:12⟧ arrive demain entre 8 h et 13 h. Le livreur vous appellera au ⟦phone:FR:nat⟧."),
    ("fr", "Ton mot de passe provisoire pour l'intranet : ⟦pw:human⟧ (à changer à la première connexion)."),
    ("fr", "Numéro de carte : ⟦card:mc2:nnbsp⟧ — expiration 03/28"),
    ("fr", "Pour la Belgique, merci de verser l'acompte sur le compte ⟦iban:BE:grouped⟧ ; pour toute question, "
           "appelez le ⟦phone:BE:*⟧."),
    ("fr", "Écrivez-moi plutôt à ⟦email:obf1⟧, je ne consulte plus l'ancienne adresse."),
    ("fr", "Le serveur de préprod (⟦ip4:private⟧) ne répond plus ; j'ai basculé le DNS vers ⟦ip6:*⟧ en attendant."),
    # ---------------- Spanish
    ("es", "oye, la contraseña del wifi de la ofi es ⟦pw:human⟧ 😅 no la compartas"),
    ("es", "Le adjunto mis datos bancarios: IBAN ⟦iban:ES:compact⟧. Mi teléfono es el ⟦phone:ES:*⟧."),
    ("es", "Hola, me cobraron dos veces con la tarjeta ⟦card:visa:dash⟧. Mi cel: ⟦phone:MX:intl⟧"),
    ("es", "Mi número de Seguro Social de EE. UU. es ⟦ssn:hyphen⟧, lo piden para la nómina de la filial de Miami."),
    ("es", "Estimado cliente: el cargo a su tarjeta ⟦card:*:*⟧ fue rechazado. Actualice sus datos o escriba a "
           "⟦email:role⟧."),
    # ---------------- Italian
    ("it", "Le credenziali del gestionale sono utente ⟦llow⟧ e password ⟦pw:human⟧, mi raccomando non girarle a nessuno."),
    ("it", "Per il bonifico: IBAN ⟦iban:IT:grouped⟧ intestato a ⟦full⟧. Per info ⟦phone:IT:*⟧."),
    ("it", "Carta Diners Club: ⟦card:diners:space⟧, scadenza 05/28."),
    # ---------------- Dutch
    ("nl", "Mijn IBAN is ⟦iban:NL:grouped⟧, mail me gerust op ⟦email⟧."),
    ("nl", "Storing: de printer op ⟦ip4:private⟧ geeft steeds 'offline'. Wachtwoord van de beheerpagina is "
           "⟦pw:human⟧ als je wilt kijken."),
    # ---------------- Polish
    ("pl", "Proszę o zwrot środków na konto ⟦iban:PL:grouped⟧. Mój numer telefonu: ⟦phone:PL:*⟧."),
    ("pl", "Dane karty: ⟦card:visa:space⟧, ważna do 10/27. Proszę o kontakt: ⟦email:plain⟧"),
    # ---------------- Portuguese
    ("pt", "Meu cartão ⟦card:mc:space⟧ foi cobrado duas vezes. Contato: ⟦phone:BR:*⟧"),
    ("pt", "NIB/IBAN para devolução: ⟦iban:PT:grouped⟧ — obrigado! ⟦first⟧"),
    # ---------------- Turkish
    ("tr", "IBAN: ⟦iban:TR:grouped⟧ — Alıcı: ⟦full⟧. Tel: ⟦phone:TR:*⟧"),
    ("tr", "Şifrem ⟦pw:human⟧, kullanıcı adım ⟦flow⟧. Giriş yapamıyorum, yardımcı olur musunuz?"),
    ("tr", "Kartım ⟦card:*:*⟧ iki kez tahsil edildi, iade için ⟦email:idn⟧ adresine yazabilirsiniz."),
    # ---------------- Japanese
    ("ja", "【お問い合わせ先】\n電話：⟦phone:JP:*⟧\nメール：⟦email:*⟧\n受付時間：平日 9:00〜18:00"),
    ("ja", "初期パスワードは ⟦pw:strong⟧ です。ログイン後に必ず変更してください。"),
    ("ja", "カード番号：⟦card:jcb:fw⟧（有効期限 09/27）"),
    ("ja", "米国社会保障番号（SSN）：⟦ssn:fw⟧\n※米国子会社での給与支払いに必要です。"),
    ("ja", "サーバー⟦ip4:private⟧に接続できません。VPN経由（⟦ip6:ula⟧）でも同じです。"),
    # ---------------- Chinese
    ("zh", "请把退款退回到我的卡⟦card:visa:space⟧，谢谢！联系电话：⟦phone:CN:*⟧"),
    ("zh", "收款账户（欧元）：IBAN ⟦iban:*:grouped⟧，收款人 ⟦full⟧。"),
    # ---------------- Russian
    ("ru", "Мой пароль от почты: ⟦pw:human⟧, логин ⟦email:plain⟧. Проверьте, пожалуйста, почему не пускает."),
    ("ru", "Сервер ⟦ip4:public⟧ недоступен с 03:12 МСК, пинг до ⟦ip6:global⟧ проходит."),
    ("ru", "Перезвоните мне, пожалуйста: ⟦phone:RU:*⟧. Номер карты для возврата ⟦card:mc:space⟧."),
    ("ru", "Реквизиты для оплаты в евро: ⟦iban:*:grouped⟧, получатель ⟦full⟧. Вопросы — на ⟦email:idn⟧."),
    # ---------------- Arabic (LRM marks around values)
    ("ar", "مرحباً، رقم جوالي \u200e⟦phone:SA:*⟧\u200e والبريد الإلكتروني \u200e⟦email:plain⟧\u200e . شكراً"),
    ("ar", "يرجى التحويل إلى الحساب \u200e⟦iban:SA:grouped⟧\u200e باسم ⟦full⟧."),
    ("ar", "للاستفسار اتصل على \u200e⟦phone:EG:*⟧\u200e أو \u200e⟦phone:AE:*⟧\u200e، وللتحويل: \u200e⟦iban:AE:grouped⟧\u200e"),
    # ---------------- Hebrew
    ("he", "הטלפון שלי \u200e⟦phone:IL:*⟧\u200e, ומספר ה-IBAN לזיכוי: \u200e⟦iban:IL:grouped⟧\u200e"),
    ("he", "כרטיס האשראי שלי \u200e⟦card:*:*⟧\u200e חויב פעמיים, אפשר לחזור אליי במייל \u200e⟦email:plain⟧\u200e"),
    # ---------------- Hindi
    ("hi", "कृपया मुझे ⟦phone:IN:*⟧ पर कॉल करें या ⟦email:idn⟧ पर ईमेल भेजें।"),
    ("hi", "सर्वर ⟦ip4:public⟧ पर लॉगिन नहीं हो रहा, पासवर्ड ⟦pw:strong⟧ काम नहीं कर रहा।"),
    ("hi", "रिफंड के लिए मेरा कार्ड नंबर ⟦card:*:space⟧ है।"),
    # ---------------- more SSNs, cards and IBANs in other languages
    ("es", "Para el formulario del IRS: mi número de Seguro Social es ⟦ssn:*⟧ y el de mi esposa ⟦ssn:*⟧. ¿Hace falta "
           "también el ITIN de los niños?"),
    ("de", "Personalakte – Entsendung USA\nName: ⟦full⟧\nSSN: ⟦ssn:*⟧\nGehaltskonto: ⟦iban:DE:grouped⟧\n"
           "E-Mail privat: ⟦email:idn⟧"),
    ("zh", "员工赴美资料：社会安全号码（SSN）⟦ssn:hyphen⟧，公司卡号 ⟦card:*:space⟧，邮箱 ⟦email:idn⟧，请勿外传。"),
    ("fr", "Pour votre dossier fiscal américain, j'ai bien noté votre numéro de sécurité sociale US (SSN) : ⟦ssn:nbsp⟧. "
           "Merci de confirmer par retour à ⟦email:idn⟧."),
    ("pt", "Meu SSN americano é ⟦ssn:*⟧ — preciso informar isso no formulário do visto? Meu WhatsApp: ⟦phone:BR:intl⟧"),
    ("he", "מספר ה-SSN האמריקאי שלי הוא \u200e⟦ssn:hyphen⟧\u200e וכרטיס האשראי לחיוב \u200e⟦card:*:space⟧\u200e"),
    ("ru", "Номер социального страхования США (SSN): ⟦ssn:*⟧. Карта для выплат: ⟦card:visa:space⟧."),
    ("de", "Bitte belasten Sie künftig meine Visa ⟦card:visa:space⟧ statt der alten Mastercard ⟦card:mc:*⟧ "
           "(gekündigt)."),
    ("fr", "Paiement refusé pour la carte ⟦card:visa:nbsp⟧. Essayez plutôt ⟦card:*:space⟧ ou un virement sur "
           "⟦iban:FR:grouped⟧."),
    ("ja", "お支払いカード：⟦card:visa:fw⟧\n領収書送付先：⟦email:fw⟧"),
    ("de", "§ 4 Miete\n(1) Die Miete ist monatlich im Voraus auf das Konto ⟦iban:DE:grouped⟧ zu überweisen.\n"
           "(2) Die Kaution von 2.400,00 € wird auf das Mietkautionskonto ⟦iban:DE:*⟧ eingezahlt.\n"
           "Hausverwaltung: ⟦phone:DE:*⟧"),
    ("es", "Tarjeta: ⟦card:mc2:space⟧ (vence 02/29). Si falla, domiciliad el recibo en ⟦iban:ES:dash⟧."),
    ("it", "Numero carta ⟦card:visa:dot⟧ intestata a ⟦full⟧; in alternativa IBAN ⟦iban:IT:lower⟧."),
    ("nl", "Creditcard ⟦card:mc:space⟧ is verlopen, graag automatische incasso via ⟦iban:NL:compact⟧."),
    ("ar", "رقم البطاقة \u200e⟦card:visa:space⟧\u200e والآيبان \u200e⟦iban:AE:grouped⟧\u200e"),
    ("pl", "Nr karty ⟦card:*:nnbsp⟧, potwierdzenie proszę wysłać na ⟦email:idn⟧."),


]

# --------------------------------------------------------------------------
# Templates with nothing to label (look-alikes only)
# --------------------------------------------------------------------------

NEG = [
    ("en", "System information\n  OS Name: Microsoft Windows 10 Pro\n  Version: 10.0.19045.3803\n  BIOS: Dell Inc. "
           "1.21.0, 14.08.2023\n  Total Physical Memory: 16,048 MB\n  Hotfix(s): 12 Hotfix(s) Installed."),
    ("en", "Windows 7 SP1 (build 6.1.7601.17514), crash report:\n"
           "Faulting application name: explorer.exe, version: 6.1.7601.17514, time stamp: 0x4ce7b96f\n"
           "Faulting module name: ntdll.dll, version: 6.1.7601.23807, time stamp: 0x5915fdce\n"
           "Exception code: 0xc0000374\nFault offset: 0x00000000000f4a13\nFaulting process id: 0x1b3c"),
    ("en", "Release notes – firmware 3.10.2.1 (2026-02-27)\n* Fixes PoE budget reporting on port 24\n"
           "* Bootloader updated to 2.0.1.8\n* Known issue: LED stays amber for ~90 s after a cold boot"),
    ("en", "# requirements.txt\nDjango==4.2.11\npsycopg2-binary==2.9.9\nlibfoo==1.2.3.4\nnumpy>=1.26,<2.0\n"
           "pywin32==306 ; sys_platform == \"win32\"\nidna==3.7  # CVE-2024-3651"),
    ("en", "FROM registry.example.com/base/python:3.11.8.2-slim\nLABEL version=\"4.1.0.17\" maintainer=\"platform team\"\n"
           "RUN pip install --no-cache-dir uvicorn==0.29.0\nEXPOSE 8080\nHEALTHCHECK CMD curl -f http://localhost:8080/health"),
    ("en", "Mar 3: upgraded to 2.14.0.1 on staging; prod stays on 2.13.9.4 until the 15th. Rollback: "
           "`docker pull acme/api:2.13.9.4 && docker compose up -d`."),
    ("en", "$ snmpwalk -v2c -c \"$SNMP_COMMUNITY\" switch-01 1.3.6.1.4.1.9.9.48\n"
           "SNMPv2-SMI::enterprises.9.9.48.1.1.1.5.1 = Gauge32: ⟦d:8⟧\nSNMPv2-SMI::enterprises.9.9.48.1.1.1.6.1 = "
           "Gauge32: ⟦d:9⟧"),
    ("en", "Received SNMPv2c trap: sysUpTime.0 = 1:02:03:04.56, snmpTrapOID.0 = 1.3.6.1.6.3.1.1.5.3 (linkDown), "
           "ifIndex.10102 = 10102, enterprise 1.3.6.1.4.1.2636.1.1.1.2.29"),
    ("en", "$ ls /mnt/backup/\ndb-full_12.03.2026.1.tar.zst\ndb-full_12.03.2026.2.tar.zst\ndb-incr_13.03.2026.1.tar.zst\n"
           "manifest_⟦dd:1741000000-1741999999⟧.json"),
    ("en", "As described in section 4.2.1.3, the receiver MUST ignore unknown extensions; see also 7.1.2.2 and "
           "Appendix B.3.1.4 for the registry."),
    ("de", "Gemäß Ziffer 3.1.2.4 des Rahmenvertrags vom 01.02.2024 verlängert sich die Laufzeit um 12 Monate, sofern "
           "nicht 3 Monate vorher gekündigt wird (vgl. Abschnitt 8.2.1.1)."),
    ("en", "Uploaded: /srv/media/2026/03/IMG_20260311_142233_⟦d0:10⟧.jpg (4.2 MB)\n"
           "Thumbnail: /srv/media/cache/thumb_640x480_⟦d0:10⟧.webp"),
    ("en", "See https://shop.example.com/account/orders/⟦d0:10⟧/invoice.pdf and "
           "https://forum.example.org/t/printer-jams/⟦d:6⟧/17 for the details."),
    ("de", "Ihre Bestellung ist unterwegs!\nBestellnummer: ⟦d0:10⟧\nKundennummer: ⟦d:8⟧\nSendungsnummer: ⟦d:20⟧\n"
           "Voraussichtliche Zustellung: Mi., 12.03.2026"),
    ("pt", "Pedido n.º ⟦d0:10⟧ confirmado. Total: R$ 1.299,90 em 3x sem juros. Previsão de entrega: 14/03."),
    ("es", "Su pedido n.º ⟦d:9⟧ ha sido enviado. Importe: 89,95 €. N.º de seguimiento PK⟦d:9⟧ES."),
    ("ru", "Заказ № ⟦d0:10⟧ передан в службу доставки. Сумма: 12\u00a0490 ₽. Трек-номер: RA⟦d:9⟧RU."),
    ("fr", "Votre numéro de commande : ⟦d0:10⟧. Montant TTC : 1\u202f249,00 €. Référence client : C-⟦d:6⟧."),
    ("ar", "تم تأكيد طلبك. رقم الطلب: \u200e⟦d0:10⟧\u200e — المبلغ: 349٫00 ر.س — رقم التتبع: \u200e⟦d:12⟧\u200e"),
    ("ja", "ご注文ありがとうございます。\n注文番号：⟦fwd0:10⟧\nお支払い金額：￥12,800（税込）\nお届け予定日：3月14日"),
    ("zh", "订单号：⟦d:18⟧\n下单时间：2026-03-11 14:22:09\n实付款：¥1,299.00\n物流单号：SF⟦d:12⟧"),
    ("tr", "Sipariş no: ⟦d0:10⟧ — Tutar: 1.249,90 TL — Kargo takip no: ⟦d:12⟧"),
    ("pl", "Zamówienie nr ⟦d0:10⟧ zostało opłacone. Kwota: 1 234,56 zł. Numer przesyłki: ⟦d:22⟧."),
    ("en", "id,sku,qty,unit_price,created\n⟦d0:10⟧,⟦AN:3⟧-⟦d:5⟧,2,19.99,⟦dd:1741000000-1741999999⟧\n"
           "⟦d0:10⟧,⟦AN:3⟧-⟦d:5⟧,1,249.00,⟦dd:1741000000-1741999999⟧\n⟦d0:10⟧,⟦AN:3⟧-⟦d:5⟧,12,3.49,"
           "⟦dd:1741000000-1741999999⟧"),
    ("en", "Stock label\nEAN: ⟦ean13⟧\nGTIN-14: ⟦gtin14⟧\nBatch: L⟦d:6⟧   Best before: 11.2027\nNet wt. 500 g"),
    ("en", "[3] Kleppmann, M. Designing Data-Intensive Applications. O'Reilly, 2017. ISBN ⟦isbn13⟧.\n"
           "[4] Tanenbaum, A. S. Computer Networks, 5th ed. ISBN ⟦isbn10⟧."),
    ("en", "Repair intake #⟦d:6⟧\nDevice: Galaxy A54 5G\nIMEI: ⟦imei⟧\nIMEI 2: ⟦imei⟧\nS/N: R5CW⟦AN:7⟧\n"
           "Issue: cracked screen, battery swelling"),
    ("en", "job=nightly-export started_at=1741651200 finished_at=1741654823 duration=3623s (1h 00m 23s) rows=⟦d:7⟧ "
           "p95_latency=0.482s exit=0"),
    ("en", "Price list 2026: Basic $1,234.56/yr · Pro 1.234,56 € · Team CHF 1'234.50 · Enterprise ₹1,23,456.00 · "
           "Japan ¥128,000 · Poland 1\u00a0234,56 zł"),
    ("en", "Trail report: start 47.6205, -122.3493; summit 46.8523° N, 121.7603° W; elevation gain 1,524 m (+12.5 %)."),
    ("en", "commit ⟦lhex:40⟧\nMerge: ⟦lhex:7⟧ ⟦lhex:7⟧\nDate:   Wed Mar 11 14:22:33 2026 +0100\n\n"
           "    Bump lodash@4.17.21 and @types/node@20.11.30"),
    ("en", "DELETE FROM sessions WHERE tenant_id = '⟦uuid⟧' AND id IN ('⟦uuid⟧', '⟦uuid⟧');\n"
           "-- 2 rows affected (0.014 s)"),
    ("en", "<img alt=\"logo\" width=\"120\" src=\"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAHgAAAB4CAYAAAA5⟦b64:96⟧\">"),
    ("en", "<script src=\"https://cdn.example.net/lib/4.2.1/lib.min.js\"\n  integrity=\"sha384-⟦b64:64⟧\"\n"
           "  crossorigin=\"anonymous\"></script>"),
    ("en", "# .env.example — copy to .env and fill in\nOPENAI_API_KEY=sk-xxxxxxxxxxxxxxxxxxxxxxxx\n"
           "AWS_ACCESS_KEY_ID=AKIAXXXXXXXXXXXXXXXX\nAWS_SECRET_ACCESS_KEY=<your-secret-key>\nDB_PASSWORD=\n"
           "GITHUB_TOKEN=ghp_<token>\nSTRIPE_KEY=YOUR_API_KEY"),
    ("en", "Payment received from card ending in ⟦d:4⟧ (Visa ****⟦d:4⟧). SSN on file: ***-**-⟦d:4⟧. "
           "Refund account: DE89 **** **** **** **30 00."),
    ("en", "Add this to authorized_keys on the bastion:\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI⟦b64:43⟧ ops@bastion"),
    ("en", "-----BEGIN PUBLIC KEY-----\n⟦ecpub⟧\n-----END PUBLIC KEY-----\n(verification key for the webhook signatures)"),
    ("en", "Direct deposit form\nBank routing number (ABA): ⟦aba⟧\nAccount type: checking\nEmployer EIN: ⟦ein⟧\n"
           "Effective: next pay period"),
    ("en", "Supplier VAT IDs on file: DE⟦d:9⟧, FR⟦d:11⟧, ATU⟦d:8⟧, NL⟦d:9⟧B01, GB⟦d:9⟧, IT⟦d:11⟧."),
    ("en", "Ship-to postcodes in this batch: 10115 Berlin · SW1A 1AA London · 75008 Paris · 94105-1804 San Francisco · "
           "100-0005 Tokyo · 00-950 Warszawa"),
    ("en", "Forgot your password? Use the \"Reset password\" link on the sign-in page. Our staff will never ask for your "
           "password by phone or e-mail."),
    ("de", "Das Passwort muss mindestens 12 Zeichen lang sein und darf nicht mit einem der letzten 5 Passwörter "
           "übereinstimmen."),
    ("en", "@channel heads-up: @maria.k is out today. Please review PR #⟦d:4⟧ (bumps @babel/core@7.24.0 and "
           "@angular/cli@17.3.1) and use `git clone git@github.com:acme/infra.git`, not https."),
    ("en", "class Invoice(Base):\n    @property\n    def total(self) -> Decimal:\n        return sum(l.amount for l in "
           "self.lines)\n\n@app.route(\"/invoices/<int:invoice_id>\")\n@login_required\ndef show(invoice_id): ..."),
    ("en", "DATABASE_URL=postgresql://reporting@db-replica.internal:5432/warehouse?sslmode=require\n"
           "REDIS_URL=redis://cache.internal:6379/2\nAMQP_URL=amqp://rabbit.internal:5672/%2F"),
    ("en", "Parcel ID ⟦badcard⟧ scanned at hub FRA-3 (2026-03-11 05:14). Next scan expected within 24 h."),
    ("en", "dhcpd: DHCPREQUEST for lease from ⟦mac⟧ (printer-2f) via vlan20 — lease time 86400 s"),
    ("en", "INC-0301-2026-1187 reassigned to Network Ops. Related: CHG-⟦d0:7⟧, PRB-⟦d0:7⟧. SLA breach in 03:12:40."),
    ("en", "Traceback (most recent call last):\n  File \"/opt/app/releases/20260311141233/app/jobs/export.py\", line 214,"
           " in run\n    batch = fetch(cursor, 5000)\n  File \"/opt/app/venv/lib/python3.11/site-packages/psycopg/"
           "cursor.py\", line 732, in fetchmany\npsycopg.errors.QueryCanceled: canceling statement due to statement "
           "timeout"),
    ("en", "Installed KB5034763 last night, now on OS Build 19045.4046 (was 19045.3930). Anyone else lose audio "
           "after that? Realtek driver is 6.0.9549.1."),
    ("en", "Build fingerprint: 'google/panther/panther:14/UQ1A.240205.004/11269751:user/release-keys'\nRevision: 'MP1.0'\n"
           "ABI: 'arm64'\npid: ⟦d:5⟧, tid: ⟦d:5⟧, name: com.example.app"),
    ("en", "Could not load file or assembly 'Newtonsoft.Json, Version=13.0.0.0, Culture=neutral, "
           "PublicKeyToken=30ad4fe6b2a6aeed' or one of its dependencies."),
    ("en", "Signature Algorithm: sha256WithRSAEncryption (1.2.840.113549.1.1.11)\nSubject: CN=api.example.com, "
           "O=Example GmbH\nCertificate Policies: 2.23.140.1.2.2\nSerial Number: ⟦colonhex:16⟧"),
    ("de", "Lieferung am 11.03.2026, Abholung 12.03.2026 zwischen 10.00 und 12.30 Uhr. Lieferschein 2026.03.0412, "
           "Version 2.1.0.3 der Packliste."),
    ("en", "Example only: IBAN ⟦badiban:DE⟧ (invalid check digits — used in our test fixtures, never a real account)."),
    ("en", "Our form rejects numbers that cannot be SSNs, e.g. ⟦badssn⟧, ⟦badssn⟧ and ⟦badssn⟧."),
    ("en", "\"dependencies\": {\"react\": \"^18.2.0\", \"left-pad\": \"~1.3.0\", \"@acme/ui\": \"workspace:*\", "
           "\"legacy-lib\": \">=3.10.2.1 <4\"}"),
    ("en", "Segmentation fault at 0x00007ffd5e8a3c10 in libcrypto.so.3 (offset 0x1a2b3c); core dumped to "
           "/var/crash/core.⟦d:5⟧.1741694400"),
    ("en", "User-Agent: Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
           "Chrome/122.0.6261.112 Safari/537.36 Edg/122.0.2365.80"),
    ("en", "Rolled the fleet from v1.2.3.4 to v1.2.4.0 overnight; 3 hosts stuck on v1.2.3.3.\n"
           "Agent inventory: host-a runs collector ⟦v4⟧, host-b ⟦v4⟧, host-c still on 1.3.255.1 (unsupported)."),
    ("en", "Sensor 4.1.2.7 reading at 06:00: 21.4 °C, 48.2 % RH, 1013.25 hPa; next calibration 2026.06.01."),
    ("ja", "商品コード｜価格｜在庫\nA-1029｜￥3,980｜12\nB-2231｜￥12,800｜0\nC-0007｜￥980｜240"),
    ("zh", "系统版本 10.0.22631.3296，显卡驱动 31.0.15.4633，固件 3.10.2.1，已是最新。"),
    ("ru", "Версия прошивки 3.10.2.1, сборка 6.1.7601.17514. Обновление до 3.10.3.0 запланировано на 15.03.2026."),
    ("ar", "رقم الفاتورة ٢٠٢٦٠٣١١٠٤ — الإجمالي ١٬٢٣٤٫٥٠ درهم — تاريخ الاستحقاق ٢٠٢٦/٠٤/١٠"),
    ("he", "מספר הזמנה: \u200e⟦d0:10⟧\u200e · סכום: 1,249.90 ₪ · משלוח עד 14.3"),
    ("hi", "ऑर्डर संख्या: ⟦d0:10⟧, कुल राशि ₹1,23,456.00, डिलीवरी 14 मार्च तक।"),
    ("tr", "Sürüm 4.2.1.3 yayınlandı. Fatura no: FTR2026⟦d:6⟧, tutar 12.499,90 TL, vergi no ⟦d:10⟧."),
    ("pl", "Faktura VAT nr FV/2026/03/⟦d:4⟧, NIP 526-000-12-46, kwota 1 234,56 zł brutto, termin 14 dni."),
    ("it", "Ordine n. ⟦d0:10⟧ spedito. Codice cliente ⟦d:7⟧. Partita IVA IT⟦d:11⟧. Totale 249,00 €."),
    ("nl", "Bestelnummer ⟦d0:10⟧ · klantnummer ⟦d:8⟧ · KvK ⟦d:8⟧ · btw NL⟦d:9⟧B01 · totaal € 1.249,00"),
    ("es", "Factura n.º F-2026-⟦d:5⟧ · CIF B⟦d:8⟧ · Total 1.249,00 € (IVA 21 % incl.)"),
    ("en", "Employee ID: E-⟦d:6⟧\nCost center: 4100-220\nGrade: L4\nStart date: 2024-09-02\nSalary band: 68,000–82,000 USD\n"
           "Manager: ⟦full⟧"),
    ("en", "Shipment ⟦ups⟧ — 2 pkgs, 14.6 kg, 60×40×40 cm. Delivered 11 Mar 2026 10:42, signed by RECEPTION."),
    ("de", "Terminbestätigung: Mi., 18.03.2026, 09:15 Uhr, Raum 2.14, Versichertennummer ⟦A:1⟧⟦d:9⟧ – bitte die "
           "Versichertenkarte mitbringen."),
    ("en", "Your parcel ⟦d:12⟧ is out for delivery today 13:00–15:00. Track: https://t.example.com/p/⟦AN:10⟧"),
    ("en", "DB_HOST=db.internal\nDB_USER=app\nDB_PASSWORD=${DB_PASSWORD}\nJWT_SECRET=${JWT_SECRET:?must be set}\n"
           "SENTRY_ENVIRONMENT=production"),
    ("en", "2026-03-11T08:00:01Z INFO auth: login ok user_id=⟦d:7⟧ password=******** token=[REDACTED] mfa=totp "
           "session=⟦uuid⟧"),
    ("en", "db_password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  ⟦lhex:64⟧\n  ⟦lhex:64⟧\n  ⟦lhex:32⟧"),
    ("en", "⟦lhex:64⟧  app-4.2.1.3-linux-amd64.tar.gz\n⟦lhex:64⟧  app-4.2.1.3-windows-amd64.zip"),
    ("en", "metadata:\n  resourceVersion: \"⟦d:8⟧\"\n  uid: ⟦uuid⟧\nspec:\n  image: ghcr.io/acme/worker@sha256:⟦lhex:64⟧"),
    ("en", "Sort code 20-00-00 · Account 5⟦d:7⟧ · Reference INV-⟦d:6⟧ · Amount £312.40"),
    ("en", "Mean reduction 12.4 % (95 % CI 8.1–16.7), p < 0.001, n = 1,482; follow-up at 6.5 and 12.0 months."),
    ("en", "2026-03-11T14:22:09.123456+01:00 | 1741699329123 ms | took 00:12:34.567 | retry 3/5"),
    ("ja", "お客様番号：⟦fwd0:10⟧　ご請求額：１２，８００円　お支払期限：３月３１日"),
    ("en", "*/15 * * * * /usr/local/bin/rotate --keep 14 >> /var/log/rotate-⟦d:8⟧.log 2>&1"),
    ("en", "[12.03.2026 09:14] ⟦first⟧: is prod on 5.4.0.2 already?\n[12.03.2026 09:15] ⟦first:1⟧: yes, since 11.03. "
           "build 5.4.0.2+⟦lhex:7⟧"),
    ("en", "The breach check sends only the first 5 hex chars of the SHA-1 (e.g. 21BD1) to the range API; the password "
           "itself never leaves the device."),
    ("en", "UPC-A ⟦upca⟧ · customer account ⟦d0:10⟧ · invoice ⟦d0:10⟧ · PO 45⟦d:8⟧"),
    ("en", "Use std::chrono::duration and Foo::Bar::baz(); see ab::cd in the header. Ratio 3:2:1, time 12:34:56."),
    ("de", "Kundennr;Auftrag;Datum;Betrag\n⟦d:6⟧;⟦d0:10⟧;11.03.2026;1.249,00\n⟦d:6⟧;⟦d0:10⟧;12.03.2026;89,90\n"
           "⟦d:6⟧;⟦d0:10⟧;12.03.2026;12,50"),
    ("es", "¿Alguien sabe cómo cambiar la contraseña del router? El manual dice \"consulte la sección 4.2.1.3\" y ahí "
           "no hay nada 🙄"),
    ("fr", "Votre mot de passe doit contenir au moins 12 caractères. Ne communiquez jamais votre mot de passe, "
           "même à notre service client."),
    ("it", "La password scade ogni 90 giorni; riceverai un promemoria 7 giorni prima. Versione app 7.3.0.12."),
    ("ja", "パスワードを忘れた場合は、ログイン画面の「パスワードを再設定」から手続きしてください。"),
    ("zh", "请勿将密码告诉任何人，客服不会向您索要密码。订单号：⟦d:16⟧"),
    ("ru", "Пароль должен содержать не менее 12 символов, включая цифру и спецсимвол. Версия клиента 2.8.1.4."),
    ("tr", "Şifrenizi kimseyle paylaşmayın. Sipariş no: ⟦d0:10⟧, tutar 349,90 TL."),
    ("pl", "Nie podawaj nikomu swojego hasła. Numer klienta: ⟦d0:10⟧."),
    ("pt", "Nunca compartilhe sua senha. Protocolo n.º ⟦d:12⟧, aberto em 11/03/2026 às 14:22."),
    ("nl", "Deel je wachtwoord nooit met anderen. Referentie: ⟦d0:10⟧, bedrag € 49,95."),
    ("he", "לעולם אל תמסרו את הסיסמה שלכם. מספר פנייה: ⟦d:8⟧."),
    ("ar", "لا تشارك كلمة المرور مع أي شخص. رقم الطلب: \u200e⟦d0:10⟧\u200e"),
    ("hi", "अपना पासवर्ड किसी के साथ साझा न करें। टिकट संख्या: ⟦d:8⟧"),
    ("en", "deploy@web-01:~$ sudo systemctl restart app\nroot@db-primary:/var/lib/postgresql# du -sh 16/main\n"
           "38G\t16/main"),
    ("en", "{\"lat\": 52.520008, \"lon\": 13.404954, \"acc\": 12.5, \"ts\": ⟦dd:1741000000-1741999999⟧, "
           "\"speed_kmh\": 4.2}"),
    ("en", "Bank codes for the SEPA export: ⟦bic⟧, ⟦bic⟧, ⟦bic⟧ (BIC only; the IBANs are stored in the vault)."),
    ("en", "Invoice 2026-⟦d:4⟧ · Customer no. ⟦d0:10⟧ · PO ⟦d:10⟧ · Due 2026-04-10 · Total €1,249.00 · Pay via the "
           "link in your account."),
    ("en", "Serial: ⟦d0:10⟧ / Model: XJ-2000 / Firmware 1.0.4.2 / HW rev C"),
    ("en", "https://console.example.com/projects/⟦uuid⟧/logs?from=1741651200&to=1741694400&page=⟦dd:2-40⟧"),
    ("en", "{\"thumbnail\": \"/9j/4AAQSkZJRgABAQ⟦b64:80⟧\", \"checksum_md5\": \"⟦b64bytes:16⟧\", \"bytes\": ⟦d:6⟧}"),
    ("en", "Migrating OID arc 1.3.6.1.4.1.⟦d:5⟧.1.2 to the new MIB; old objects under 1.3.6.1.4.1.⟦d:5⟧.3 are deprecated."),
    ("de", "Version 10.0.19045.3803 ist installiert, Treiber 31.0.101.4502, BIOS 1.18.0. Kundennummer ⟦d0:10⟧."),
    ("fr", "Mise à jour vers la version 5.2.0.14 effectuée. Numéro de ticket : ⟦d:7⟧. Durée : 00:04:12."),
    ("es", "Actualizado a la versión 3.1.4.1 — reinicio necesario. Pedido n.º ⟦d0:10⟧, 149,00 €."),
    ("it", "Firmware 2.0.7.3 installato sul router, numero di serie ⟦AN:12⟧, riavvio alle 03:00."),
    ("pt", "Firmware atualizado para 1.8.2.6. Número de série: ⟦AN:10⟧. Nota fiscal n.º ⟦d:9⟧."),
    ("ru", "Счёт № ⟦d:8⟧ от 11.03.2026, ИНН ⟦d:10⟧, сумма 48\u00a0300,00 ₽. Артикул ⟦d0:10⟧."),
    ("zh", "发票号码：⟦d:8⟧，纳税人识别号：91310000⟦AN:10⟧，金额：￥3,480.00，二维码见附件 qr_⟦d:13⟧.png。"),
    ("ja", "ビルド番号 6.1.7601.17514 のままです。チケット番号：⟦d:7⟧、対応期限：3月20日。"),
    ("en", "IMEI check: ⟦imei⟧ is not blacklisted. Warranty until 2027-02-14. Order ⟦d0:10⟧."),
    ("en", "Hashes for release 4.2.1.3:\nmd5    ⟦lhex:32⟧\nsha1   ⟦lhex:40⟧\nsha256 ⟦lhex:64⟧"),
    ("en", "Placeholders in the docs: `Authorization: Bearer <token>`, `X-API-Key: YOUR_API_KEY`, "
           "`sk_live_...`, `hf_***`, `glpat-XXXXXXXXXXXXXXXXXXXX`."),
    ("en", "Masked in export: card ************⟦d:4⟧, IBAN ****⟦d:4⟧, phone +49 *** ****⟦d:2⟧, SSN XXX-XX-⟦d:4⟧."),
    ("en", "Please reference your tracking number 9400 1⟦d:3⟧ ⟦d:4⟧ ⟦d:4⟧ ⟦d:4⟧ ⟦d:2⟧ when you call — note that we "
           "cannot change the delivery address."),
    ("en", "Library checkout: \"The Pragmatic Programmer\" ISBN ⟦isbn13⟧, barcode ⟦d0:10⟧, due 2026-03-25."),
    ("en", "| order | customer | amount | status |\n|---|---|---|---|\n| ⟦d0:10⟧ | ⟦d:6⟧ | 49.90 | paid |\n"
           "| ⟦d0:10⟧ | ⟦d:6⟧ | 129.00 | refunded |\n| ⟦d0:10⟧ | ⟦d:6⟧ | 8.50 | open |"),
    ("de", "Preis: 1.234,56\u00a0€ inkl. 19\u00a0% MwSt., Artikelnr. ⟦d:7⟧, EAN ⟦ean13⟧."),
    ("fr", "Prix : 1\u202f234,56 €, TVA 20\u00a0%, référence ⟦AN:8⟧, code-barres ⟦ean13⟧."),
    ("en", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ⟦b64:120⟧ build-agent\n(public key — safe to share)"),
    ("en", "Let's use @here sparingly. Newsletter goes out via the @acme/mailer package; decorators like @dataclass "
           "and @staticmethod are fine in examples."),
    ("en", "The password field was left empty, so the request was rejected (error code PWD-0042)."),
    ("ja", "注文番号：⟦d0:10⟧\n配送伝票番号：⟦d:12⟧\n合計：￥5,480（送料込み）"),
    ("zh", "订单号 ⟦d0:10⟧ 已发货，运单号 YT⟦d:13⟧，预计 3 月 14 日送达。"),
    ("tr", "Sipariş no ⟦d0:10⟧ kargoya verildi. Takip: ⟦d:12⟧. Sürüm 6.1.7601.17514 desteklenmiyor."),
    ("pl", "Zamówienie nr ⟦d0:10⟧, faktura ⟦d:6⟧/03/2026, wersja aplikacji 4.2.0.1."),
    ("ar", "رقم العميل: \u200e⟦d0:10⟧\u200e — الإصدار 3.10.2.1 — المبلغ 1,250.00 د.إ"),
    ("he", "מספר לקוח \u200e⟦d0:10⟧\u200e, גרסה 2.14.0.1, חשבונית מס' ⟦d:6⟧"),
    ("hi", "संस्करण 4.2.1.3 उपलब्ध है। ग्राहक संख्या ⟦d0:10⟧, बिल राशि ₹2,499.00"),
    ("nl", "Versie 10.0.19045.3803 — factuurnummer ⟦d:8⟧ — klantnummer ⟦d0:10⟧ — totaal € 89,00"),
    ("pt", "Encomenda n.º ⟦d0:10⟧ — NIF da empresa 5⟦d:8⟧ — total 39,90 €"),
    ("it", "Fattura n. ⟦d:5⟧/2026 — codice fiscale azienda ⟦d:11⟧ — ordine ⟦d0:10⟧"),
    ("ru", "Номер заказа ⟦d0:10⟧, трек ⟦d:14⟧, версия приложения 3.14.0.1"),
    ("de", "Seriennummer ⟦AN:10⟧, Firmware-Version 3.10.2.1, Artikelnummer ⟦d0:10⟧, Garantie bis 03/2028."),
    ("fr", "Facture n° ⟦d:8⟧ – SIRET ⟦d:14⟧ – TVA intracom. FR⟦d:11⟧ – échéance 30/04/2026."),
    ("es", "te paso el número de pedido: ⟦d0:10⟧ y el de cliente ⟦d:8⟧, la app está en la versión 2.14.0.1"),
    ("pt", "CNPJ ⟦d:2⟧.⟦d:3⟧.⟦d:3⟧/0001-⟦d:2⟧ · Pedido ⟦d0:10⟧ · Frete R$ 24,90 · Prazo 5 dias úteis"),
    ("ru", "ОГРН ⟦d:13⟧, КПП ⟦d:9⟧, БИК 04⟦d:7⟧, договор № ⟦d0:10⟧ от 11.03.2026"),
    ("ja", "〒100-0005 東京都千代田区丸の内1-9-1　会議室 4.2.1　アプリのバージョン 2.14.0.1"),
    ("zh", "版本号 v1.2.3.4，构建号 20260311.1，提交 ⟦lhex:40⟧，耗时 00:03:27。"),
    ("tr", "Ürün kodu ⟦d0:10⟧, seri no ⟦AN:12⟧, IMEI ⟦imei⟧, garanti bitişi 14.02.2027"),
    ("ar", "رقم الإصدار 10.0.19045.3803 ورقم التذكرة ⟦d:7⟧ — مدة المعالجة 00:04:12"),
    ("hi", "आईएमईआई ⟦imei⟧, सीरियल नंबर ⟦AN:10⟧, संस्करण 1.2.3.4"),
    ("pl", "Numer seryjny ⟦AN:10⟧, IMEI ⟦imei⟧, wersja oprogramowania 4.4.0.1, gwarancja do 2027-02-14."),
    ("nl", "Pakketnummer 3S⟦AN:13⟧ · postcode 1012 AB · app-versie 2.0.0.1"),
    ("it", "Pratica n. ⟦d:10⟧, protocollo ⟦d:6⟧/2026, ver. 4.0.2.1, durata chiamata 00:12:41."),
    ("he", "גרסה 4.2.1.3 · מספר הזמנה \u200e⟦d0:10⟧\u200e · ברקוד ⟦ean13⟧"),
    ("en", "$ docker images\nREPOSITORY   TAG       IMAGE ID       CREATED       SIZE\nacme/agent   4.2.1.3   ⟦lhex:12⟧   "
           "2 days ago    182MB\nacme/agent   4.2.1.2   ⟦lhex:12⟧   9 days ago    181MB"),
    ("es", "Referencia del pago: ⟦d0:10⟧ · Número de cliente: ⟦d:8⟧ · Importe: 1.299,00 €"),
]


# --------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------


def build():
    gen = Gen(SEED)
    r = gen.r
    # every template is used exactly once
    assert (len(POS), len(NEG)) == (N_POS, N_NEG), (len(POS), len(NEG))
    jobs = [("pos", i) for i in range(len(POS))] + [("neg", i) for i in range(len(NEG))]
    r.shuffle(jobs)
    records = []
    for n, (kind, i) in enumerate(jobs, 1):
        lang, tpl = (POS if kind == "pos" else NEG)[i]
        parts = render(gen, lang, tpl)
        nfd = lang in NFD_LANGS and r.random() < 0.14
        text, labels = assemble(parts, nfd=nfd)
        if kind == "neg":
            assert not labels, tpl
        else:
            assert labels, tpl
        records.append({"id": f"{PREFIX}-{n:03d}", "lang": lang, "text": text,
                        "labels": [{"entity": l["entity"], "value": l["value"]} for l in labels],
                        "_starts": [l["start"] for l in labels], "_nfd": nfd, "_tpl": (kind, i)})
    return gen, records


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

GLUED_OK = ("SSN", "-p")
UNICODE_FORMS = (NBSP, THIN, NNBSP, ZWSP, SHY, NBHY, HYPH, ENDASH, FWSP, "＠", LRM)


def has_unicode_form(text: str) -> bool:
    if any(c in text for c in UNICODE_FORMS):
        return True
    if any("\uff10" <= c <= "\uff19" for c in text):
        return True
    return any(unicodedata.combining(c) for c in text)


def card_brand(d: str) -> str | None:
    n = len(d)
    if d[0] == "4" and n in (13, 16, 19):
        return "visa"
    if (51 <= int(d[:2]) <= 55 or 2221 <= int(d[:4]) <= 2720) and n == 16:
        return "mastercard"
    if d[:2] in ("34", "37") and n == 15:
        return "amex"
    if (d.startswith("6011") or d.startswith("65") or 644 <= int(d[:3]) <= 649) and 16 <= n <= 19:
        return "discover"
    if 3528 <= int(d[:4]) <= 3589 and 16 <= n <= 19:
        return "jcb"
    if (d[:2] == "36" or 300 <= int(d[:3]) <= 305) and n == 14:
        return "diners"
    return None


def validate_value(entity: str, value: str, region: str | None = None, lang: str = "en") -> str | None:
    nk = unicodedata.normalize("NFKC", unicodedata.normalize("NFC", value))
    if entity == "card":
        d = re.sub(r"[\s\-.\u00ad\u200b]", "", nk)
        if not d.isdigit() or not 13 <= len(d) <= 19 or not luhn_ok(d):
            return "card not Luhn-valid"
        return None if card_brand(d) else "card brand prefix or length"
    if entity == "iban":
        c = re.sub(r"[\s\-\u00ad]", "", nk).upper()
        return None if iban_compact_valid(c) else "iban invalid"
    if entity == "national_id":
        d = re.sub(r"\D", "", nk.replace("SSN", ""))
        return None if len(d) == 9 and std_ssn.is_valid(d) else "ssn invalid"
    if entity == "ip_address":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return "ip invalid"
        return None
    if entity == "phone":
        if region:
            return None if phone_valid(value, region) else f"phone invalid for {region}"
        regions = LANG_REGIONS.get(lang, []) + [x for v in LANG_REGIONS.values() for x in v] + \
            ["SE", "NO", "DK", "FI", "KR", "CZ", "GR"]
        return None if any(phone_valid(value, x) for x in regions) else "phone invalid"
    if entity == "email":
        if "@" in nk or " at " in nk or "(at)" in nk or "[at]" in nk:
            return None
        return "email without at"
    if entity == "credential":
        return None if len(value) >= 8 else "credential too short"
    return "unknown entity"


def check_records(records, meta=None) -> list[str]:
    errors = []
    region_of = {}
    if meta:
        for ent, v, m in meta:
            if ent == "phone":
                region_of[v] = m["region"]
                region_of[unicodedata.normalize("NFD", v)] = m["region"]
    seen_values = {}
    for rec in records:
        text = rec["text"]
        cursor = 0
        for lab in rec["labels"]:
            v, ent = lab["value"], lab["entity"]
            if ent not in ENTITIES:
                errors.append(f"{rec['id']}: unknown entity {ent}")
            idx = text.find(v, cursor)
            if idx < 0:
                errors.append(f"{rec['id']}: value not found in order: {v!r}")
                continue
            before = text[idx - 1] if idx > 0 else " "
            after = text[idx + len(v)] if idx + len(v) < len(text) else " "
            glued = any(text[:idx].endswith(g) for g in GLUED_OK)
            if (before.isascii() and before.isalnum() and not glued) or (after.isascii() and after.isalnum()):
                errors.append(f"{rec['id']}: value touches alnum: {text[max(0, idx - 5):idx + len(v) + 5]!r}")
            if v != v.strip():
                errors.append(f"{rec['id']}: value has outer whitespace: {v!r}")
            cursor = idx + len(v)
            err = validate_value(ent, v, region_of.get(v), rec["lang"])
            if err:
                errors.append(f"{rec['id']}: {err}: {v!r}")
            key = (ent, unicodedata.normalize("NFC", v))
            if key in seen_values and seen_values[key] != rec["id"]:
                errors.append(f"{rec['id']}: value also in {seen_values[key]}: {v!r}")
            seen_values.setdefault(key, rec["id"])
    # overlapping values inside one text
    for rec in records:
        spans, cursor = [], 0
        for lab in rec["labels"]:
            idx = rec["text"].find(lab["value"], cursor)
            spans.append((idx, idx + len(lab["value"])))
            cursor = idx + len(lab["value"])
        for (a, b), (c, d) in zip(spans, spans[1:]):
            if c < b:
                errors.append(f"{rec['id']}: overlapping values")
    return errors


def scan_negatives(records) -> list[str]:
    """Flag things in unlabelled texts that would have to be labelled."""
    issues = []
    for rec in records:
        if rec["labels"]:
            continue
        t = unicodedata.normalize("NFKC", rec["text"])
        for m in re.finditer(r"[\w.+-]+@[\w-]+(\.[\w-]+)+", t):
            s = m.group(0)
            if s.startswith("git@github.com") or "@sha256" in s or re.search(r"@\d", s) or \
                    t[:m.start()].endswith("://"):
                continue
            issues.append(f"{rec['id']}: e-mail-like {s!r}")
        for m in re.finditer(r"(?<![\d.])(\d{13,19})(?![\d.])", re.sub(r"(?<=\d)[ \-](?=\d)", "", t)):
            d = m.group(1)
            if luhn_ok(d) and validate_value("card", d) is None:
                issues.append(f"{rec['id']}: Luhn-valid card-like {d}")
        for m in re.finditer(r"(?<!\d)(\d{3})[- ](\d{2})[- ](\d{4})(?!\d)", t):
            if std_ssn.is_valid("".join(m.groups())):
                issues.append(f"{rec['id']}: valid SSN-like {m.group(0)}")
        for m in re.finditer(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?\b", t):
            c = m.group(0).replace(" ", "")
            if iban_mod97_ok(c) and std_iban.is_valid(c):
                issues.append(f"{rec['id']}: valid IBAN {m.group(0)}")
        for pat in (r"AKIA[A-Z2-7]{16}", r"gh[pousr]_[A-Za-z0-9]{36}", r"sk-[A-Za-z0-9]{20}T3Blbk", r"xox[bp]-\d",
                    r"AIza[\w-]{35}", r"eyJ[\w-]+\.eyJ", r"-----BEGIN [A-Z ]*PRIVATE", r"hf_[A-Za-z]{34}"):
            if re.search(pat, t) and not re.search(pat.replace("A-Z2-7", "X"), t):
                issues.append(f"{rec['id']}: credential-like {pat}")
    return issues


def review_lists(records):
    """What a reviewer should eyeball in unlabelled texts: dotted quads and phone-like numbers."""
    quads, phones = [], []
    for rec in records:
        if rec["labels"]:
            continue
        t = unicodedata.normalize("NFKC", rec["text"])
        for m in re.finditer(r"(?<![\d.])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?![\d])", t):
            if all(int(x) <= 255 for x in m.groups()):
                quads.append(m.group(0))
        region = (LANG_REGIONS.get(rec["lang"]) or ["US"])[0]
        for m in phonenumbers.PhoneNumberMatcher(t, region, leniency=phonenumbers.Leniency.VALID):
            phones.append(m.raw_string)
    return quads, phones


def count_table(records) -> str:
    per = collections.Counter()
    texts_with = collections.Counter()
    for rec in records:
        ents = set()
        for lab in rec["labels"]:
            per[lab["entity"]] += 1
            ents.add(lab["entity"])
        for e in ents:
            texts_with[e] += 1
    n = len(records)
    pos = sum(1 for r in records if r["labels"])
    non_en = sum(1 for r in records if r["lang"] != "en")
    uni = sum(1 for r in records if has_unicode_form(r["text"]))
    either = sum(1 for r in records if r["lang"] != "en" or has_unicode_form(r["text"]))
    nfd = sum(1 for r in records if unicodedata.normalize("NFC", r["text"]) != r["text"])
    langs = collections.Counter(r["lang"] for r in records)
    lines = [f"texts: {n}   with labels: {pos} ({100 * pos / n:.0f} %)   without: {n - pos}",
             f"non-English: {non_en}   with Unicode forms: {uni}   either: {either} ({100 * either / n:.0f} %)   "
             f"NFD: {nfd}",
             "langs: " + ", ".join(f"{k} {v}" for k, v in sorted(langs.items(), key=lambda kv: -kv[1])),
             "",
             f"{'entity':<13}{'values':>7}{'texts':>7}"]
    for e in ENTITIES:
        lines.append(f"{e:<13}{per[e]:>7}{texts_with[e]:>7}")
    lines.append(f"{'total':<13}{sum(per.values()):>7}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="validate the committed file instead of writing it")
    ap.add_argument("--review", action="store_true", help="also list dotted quads and phone-like numbers in "
                                                         "unlabelled texts")
    args = ap.parse_args()
    if args.check:
        records = [json.loads(line) for line in OUT.read_text(encoding="utf-8").splitlines() if line.strip()]
        gen = None
    else:
        gen, records = build()
    errors = check_records(records, gen.meta if gen else None)
    errors += scan_negatives(records)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        errors.append("duplicate ids")
    if not args.check:
        with OUT.open("w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps({k: rec[k] for k in ("id", "lang", "text", "labels")}, ensure_ascii=False) + "\n")
        reread = [json.loads(line) for line in OUT.read_text(encoding="utf-8").splitlines()]
        assert [r["text"] for r in reread] == [r["text"] for r in records]
    print(count_table(records))
    if args.review:
        quads, phones = review_lists(records)
        print("\ndotted quads in unlabelled texts:", sorted(set(quads)))
        print("phone-like numbers in unlabelled texts:", phones)
    if errors:
        print("\nERRORS:")
        for e in errors:
            print("  " + e)
        sys.exit(1)
    print("\nall values valid")


if __name__ == "__main__":
    main()
