"""Deterministic, realistic customer-support tickets for `make demo` and the tests.

The demo classifies tickets zero-shot and summarises them extractively, so the text has to read
like real support mail: varied wording, several sentences, details that matter, the odd typo
and the odd second topic mentioned in passing. The true category goes to a separate truth file
so accuracy can be measured without leaking the label into the input.

The first day's file also carries one of each deliberately bad row (see `BAD_ROW_REASONS`) so
validation, duplicate handling and context-window limits are exercised by a single partition.
"""

import datetime as dt
import json
import os
import random
import re
import tempfile
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["BAD_ROW_REASONS", "CATEGORIES", "CHANNELS", "GeneratedDemo", "generate_demo_data"]

CATEGORIES: tuple[str, ...] = (
    "billing",
    "technical_issue",
    "account_access",
    "shipping",
    "product_feedback",
)
CHANNELS: tuple[str, ...] = ("email", "chat", "web", "phone")
BAD_ROW_REASONS: tuple[str, ...] = (
    "empty_body",
    "duplicate_id",
    "missing_date",
    "oversized_body",
    "missing_id",
)
MISSING_ID = "<missing>"
OVERSIZED_BODY_CHARS = 60_000

# Mildly skewed like a real inbox, yet every category shows up whenever tickets_per_day >= 5.
_CATEGORY_WEIGHTS: dict[str, float] = {
    "billing": 0.22,
    "technical_issue": 0.26,
    "account_access": 0.18,
    "shipping": 0.20,
    "product_feedback": 0.14,
}
_CHANNEL_WEIGHTS: tuple[float, ...] = (0.42, 0.25, 0.23, 0.10)
_TONES: tuple[str, ...] = ("polite", "neutral", "frustrated")
_TONE_WEIGHTS: dict[str, tuple[float, ...]] = {
    "billing": (0.35, 0.40, 0.25),
    "technical_issue": (0.30, 0.40, 0.30),
    "account_access": (0.30, 0.40, 0.30),
    "shipping": (0.30, 0.40, 0.30),
    "product_feedback": (0.60, 0.35, 0.05),
}

_FIRST_NAMES: tuple[str, ...] = (
    "Priya", "James", "Sofia", "Liam", "Aisha", "Mateo", "Chen", "Olivia", "Kwame", "Hannah",
    "Diego", "Yuki", "Fatima", "Noah", "Ingrid", "Ravi", "Chloé", "Tomasz", "Amara", "Lucas",
    "Mei", "Oluwaseun", "Emma", "Sebastián", "Nadia", "Patrick", "Zoë", "Arjun", "Leila", "Marcus",
    "Freya", "Hiroshi", "Gabriela", "Samuel", "Anika", "Jonas", "Keisha", "Dmitri", "Rosa", "Ethan",
)  # fmt: skip
_LAST_NAMES: tuple[str, ...] = (
    "Sharma", "O'Connor", "Rossi", "Nguyen", "Okafor", "García", "Wang", "Smith", "Mensah",
    "Müller", "Fernández", "Tanaka", "Haddad", "Johnson", "Larsen", "Patel", "Dubois", "Kowalski",
    "Adeyemi", "Silva", "Chen", "Brown", "Martínez", "Ivanova", "Walsh", "Kim", "Novak", "Ahmed",
    "Schmidt", "Lopez", "Eriksson", "Murphy", "Costa", "Yilmaz", "Reyes", "Fischer", "Baker",
)  # fmt: skip
_EMAIL_DOMAINS: tuple[str, ...] = ("example.com", "example.net", "example.org", "mail.example")

_PRODUCTS: tuple[str, ...] = (
    "Lumo Hub",
    "Lumo Cam 2",
    "Lumo Cam Outdoor",
    "Lumo Doorbell",
    "Lumo Thermostat",
    "Lumo Smart Plug",
    "Lumo Mesh Router",
    "Lumo Air Sensor",
    "Lumo Light Strip",
)
_CAMERAS: tuple[str, ...] = ("Lumo Cam 2", "Lumo Cam Outdoor", "Lumo Doorbell")
_PLANS: tuple[str, ...] = (
    "Lumo Plus monthly",
    "Lumo Plus annual",
    "Lumo Pro",
    "Family plan",
    "Cloud Storage 30-day",
)
_DEVICES: tuple[str, ...] = (
    "an iPhone 15 on iOS 18",
    "an iPhone 12 on iOS 17",
    "a Pixel 8 on Android 14",
    "a Samsung Galaxy S23",
    "a Galaxy A52 on Android 13",
    "an iPad Air",
    "a OnePlus 11",
    "a Windows 11 laptop",
    "a MacBook Air",
    "a Motorola G84",
)
_BROWSERS: tuple[str, ...] = ("Chrome", "Safari", "Firefox", "Edge")
_CARRIERS: tuple[str, ...] = ("UPS", "FedEx", "DHL", "USPS", "DPD", "Royal Mail", "Canada Post")
_CITIES: tuple[str, ...] = (
    "Lagos", "Moscow", "São Paulo", "Jakarta", "Bucharest", "Manila", "Hanoi", "Lima", "Kyiv",
    "Chicago", "Leeds", "Toronto", "Denver", "Lyon", "Kraków",
)  # fmt: skip
_ROOMS: tuple[str, ...] = (
    "living room", "kitchen", "nursery", "hallway", "garage", "home office", "bedroom",
    "utility room",
)  # fmt: skip
_FEATURES: tuple[str, ...] = (
    "a dark mode",
    "a home-screen widget",
    "per-room schedules",
    "an away mode that follows my phone's location",
    "a way to share a single camera with a guest",
    "quiet hours for notifications",
    "a weekly energy report",
    "activity zones for the camera",
)
_INTEGRATIONS: tuple[str, ...] = (
    "Home Assistant", "Apple Home", "Google Home", "Alexa", "IFTTT", "SmartThings", "Matter",
)  # fmt: skip
_ERROR_CODES: tuple[str, ...] = (
    "E-102", "E-217", "E-404", "E-503", "NET_TIMEOUT", "PAIR_FAILED", "AUTH_EXPIRED", "0x8004",
)  # fmt: skip
_MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip

# Generic subjects, used now and then instead of the problem's own.
_SUBJECTS: dict[str, tuple[str, ...]] = {
    "billing": ("Billing question", "Question about my bill", "Problem with a payment"),
    "technical_issue": ("Technical problem", "Device not working", "Something's broken"),
    "account_access": ("Account problem", "Can't access account", "Sign-in trouble"),
    "shipping": ("Delivery problem", "Question about my order", "Order {order}"),
    "product_feedback": ("Some feedback", "Feedback", "A suggestion"),
}

# Each problem statement carries the subjects a customer would plausibly write above it.
_PROBLEMS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "billing": (
        (
            "I was charged twice for my {plan} subscription this month.",
            ("Charged twice", "Double charge on my card", "Duplicate subscription charge"),
        ),
        (
            "There's a charge of {amount} on my {card} that I don't recognise.",
            ("Unexpected charge of {amount}", "Unknown charge", "What is this charge?"),
        ),
        (
            "I cancelled my {plan} on {date} but I was still billed {amount}.",
            ("Cancelled but still billed", "Charged after cancelling"),
        ),
        (
            "My invoice for order {order} shows {amount}, but the checkout page said {amount2}.",
            ("Invoice amount wrong", "Question about my invoice", "Billing issue with {order}"),
        ),
        (
            "I was promised a refund of {amount} for order {order} and it still hasn't "
            "reached my bank.",
            ("Refund not received", "Where is my refund?", "Refund for {order}"),
        ),
        (
            "The discount code I used at checkout was not applied to my bill.",
            ("Discount code not applied", "Promo code didn't work"),
        ),
        (
            "You renewed my {plan} at full price even though I was on a promotional rate.",
            ("Renewal at wrong price", "Subscription renewal charge"),
        ),
        (
            "I need a proper VAT invoice for order {order} for my company's expense report.",
            ("Need a VAT invoice", "Invoice request for {order}"),
        ),
        (
            "My payment keeps getting declined at checkout even though my {card} works "
            "everywhere else.",
            ("Payment declined", "Card keeps getting declined"),
        ),
        (
            "I upgraded to {plan} and was charged the full {amount} instead of a prorated amount.",
            ("Upgrade charge not prorated", "Charged full price for upgrade"),
        ),
        (
            "I'd like to switch my subscription from monthly to annual billing and get credit "
            "for the rest of this month.",
            ("Switch to annual billing", "Change billing cycle"),
        ),
        (
            "You charged me {amount} in sales tax on order {order}, which looks far too high.",
            ("Sales tax too high", "Tax on order {order}"),
        ),
        (
            "My free trial was supposed to end without a charge, but I was billed {amount} "
            "on {date}.",
            ("Charged after free trial", "Trial charge?"),
        ),
        (
            "I was overcharged on order {order}: the total came to {amount} instead of {amount2}.",
            ("Overcharged", "Wrong amount billed"),
        ),
        (
            "Can you please update the billing address and the card on file for my subscription?",
            ("Update card on file", "Change billing details"),
        ),
        (
            "The refund for my returned {product} was only {amount}, not the full price I paid.",
            ("Partial refund?", "Refund amount wrong"),
        ),
        (
            "I keep getting billed for a second {plan} subscription that I never signed up for.",
            ("Billed for a subscription I don't have", "Extra subscription charge"),
        ),
        (
            "My statement shows a pending payment of {amount} to you that never cleared, "
            "and now there's a second charge on top of it.",
            ("Pending charge plus a second one", "Charged twice"),
        ),
    ),
    "technical_issue": (
        (
            "The Lumo app keeps crashing as soon as I open the camera view on {device}.",
            ("App keeps crashing", "App crash on camera view"),
        ),
        (
            "My {product} goes offline every few hours and I have to unplug it to bring it back.",
            ("{product} offline again", "Device keeps going offline"),
        ),
        (
            "After the latest firmware update my {product} is stuck on a blinking orange light.",
            ("Firmware update failed", "Blinking orange light"),
        ),
        (
            "The Lumo app shows error {error_code} whenever I try to add a new device.",
            ("Error {error_code}", "Can't add a new device"),
        ),
        (
            "My {product} won't connect to my Wi-Fi even though every other device in the "
            "house does.",
            ("Device won't connect to wifi", "{product} wifi problem"),
        ),
        (
            "Motion alerts from my {camera} arrive ten minutes late or not at all.",
            ("Motion alerts delayed", "Late notifications"),
        ),
        (
            "The live video from my {camera} freezes after a few seconds and then says "
            "'stream unavailable'.",
            ("Video feed freezing", "Stream unavailable"),
        ),
        (
            "Since updating the app to version {app_version} on {device}, it never gets past "
            "the splash screen.",
            ("App stuck on splash screen", "App won't open after update"),
        ),
        (
            "My {product} keeps rebooting itself in the middle of the night.",
            ("{product} keeps rebooting", "Random restarts"),
        ),
        (
            "The automations I set up in the app stopped triggering after last week's update.",
            ("Automations broken after update", "Automations not running"),
        ),
        (
            "The web dashboard in {browser} shows a blank page after I sign in.",
            ("Blank dashboard", "Web dashboard not loading"),
        ),
        (
            "My {product} won't pair over Bluetooth during setup, it times out at the last step.",
            ("Can't pair my {product}", "Setup times out"),
        ),
        (
            "The battery in my {camera} drains from full to empty in about {n} days.",
            ("Battery draining fast", "{camera} battery life"),
        ),
        (
            "Recordings from my {camera} are missing from the history for several hours every day.",
            ("Missing recordings", "Gaps in camera history"),
        ),
        (
            "Two-way audio on my {camera} is full of static and echo, so nobody can understand me.",
            ("Audio static and echo", "Two-way audio broken"),
        ),
        (
            "The app freezes and shows error {error_code} when I try to update the firmware "
            "on my {product}.",
            ("Firmware update error {error_code}", "Can't update firmware"),
        ),
        (
            "Push notifications stopped working entirely on {device}.",
            ("Notifications not working", "No push notifications"),
        ),
        (
            "The night vision on my {camera} just shows a white haze since the last update.",
            ("Night vision broken", "White haze on camera at night"),
        ),
    ),
    "account_access": (
        (
            "I can't log in to my account, it says my password is incorrect even after I reset it.",
            ("Can't log in", "Password not accepted"),
        ),
        (
            "The password reset email never arrives at {email}.",
            ("Password reset not working", "No reset email"),
        ),
        (
            "My account was locked after too many login attempts and I can't unlock it.",
            ("Account locked", "Locked out of my account"),
        ),
        (
            "I got a new phone and no longer have access to my two-factor authentication codes.",
            ("Lost my 2FA device", "New phone, can't get 2FA codes"),
        ),
        (
            "I'm not receiving the SMS verification code when I try to sign in.",
            ("No verification code", "SMS code never arrives"),
        ),
        (
            "Someone changed the email address on my account without my permission and now "
            "I'm locked out.",
            ("Account hijacked?", "Email changed without permission"),
        ),
        (
            "I got an email about a sign-in to my account from {city}, and that wasn't me.",
            ("Suspicious sign-in", "Sign-in from {city}"),
        ),
        (
            "When I sign in with Google it creates a brand new empty account instead of "
            "opening my existing one.",
            ("Google sign-in opens wrong account", "Empty account after login"),
        ),
        (
            "The reset link in the password email says it has expired as soon as I click it.",
            ("Reset link expired", "Password link not working"),
        ),
        (
            "I need to change the login email on my account to {email} but the settings page "
            "won't let me.",
            ("Change account email", "Update login email"),
        ),
        (
            "My account has been deactivated and I have no idea why.",
            ("Account deactivated?", "Why was my account disabled"),
        ),
        (
            "I'm stuck in a login loop: I enter my credentials, it says success, and then it "
            "sends me back to the sign-in page.",
            ("Login loop", "Keeps sending me back to sign in"),
        ),
        (
            "I'm the account owner but I can no longer get into the admin settings to remove "
            "a former household member.",
            ("Can't access admin settings", "Owner locked out of settings"),
        ),
        (
            "I forgot which email address I used to register and can't recover my account.",
            ("Help recovering my account", "Forgot my login email"),
        ),
        (
            "I get signed out of my account every few minutes and have to enter my password again.",
            ("Keeps logging me out", "Signed out constantly"),
        ),
        (
            "I want to close an old duplicate account but I can't sign in to it.",
            ("Can't sign in to old account", "Duplicate account"),
        ),
        (
            "The code from my authenticator app is always rejected as invalid when I log in.",
            ("2FA code rejected", "Authenticator code invalid"),
        ),
    ),
    "shipping": (
        (
            "My order {order} was supposed to arrive on {date} and it still hasn't shown up.",
            ("Where is my order?", "Order {order} not delivered", "Late delivery"),
        ),
        (
            "Tracking for order {order} hasn't updated in {days_n} days, it just says "
            "'label created'.",
            ("Tracking not updating", "Order {order} stuck at label created"),
        ),
        (
            "The {carrier} tracking says my package was delivered, but there is nothing at "
            "my door.",
            ("Package marked delivered but not here", "Delivered? No package"),
        ),
        (
            "My {product} arrived with the box crushed and the device inside is cracked.",
            ("Damaged on arrival", "Arrived broken"),
        ),
        (
            "I received the wrong item: I ordered a {product} but got a {product2} instead.",
            ("Wrong item received", "Wrong product in my box"),
        ),
        (
            "Order {order} arrived with only some of the items, the {product} is missing.",
            ("Missing item from order {order}", "Incomplete delivery"),
        ),
        (
            "I need to change the delivery address on order {order} before it ships.",
            ("Change delivery address", "Wrong address on {order}"),
        ),
        (
            "My package with order {order} has been stuck in customs for over a week.",
            ("Stuck in customs", "Customs hold on {order}"),
        ),
        (
            "I paid for express shipping on order {order} and the package still took "
            "{days_n} days to arrive.",
            ("Express shipping was not express", "Slow express delivery"),
        ),
        (
            "The courier left my package with a neighbour I don't know and now I can't find it.",
            ("Package left with a neighbour", "Can't find my parcel"),
        ),
        (
            "My order {order} was returned to sender, and nobody told me why.",
            ("Order returned to sender?", "Why was {order} sent back"),
        ),
        (
            "I've been waiting {days_n} days for order {order} to ship, it still says "
            "'processing'.",
            ("Order still processing", "When will {order} ship?"),
        ),
        (
            "{carrier} says they attempted delivery on {date} but nobody came, and I was home "
            "all day.",
            ("Missed delivery that never happened", "Failed delivery attempt"),
        ),
        (
            "Can I collect order {order} from a local {carrier} location instead of having it "
            "delivered?",
            ("Pick up instead of delivery", "Collect order {order}"),
        ),
        (
            "The return label for my {product} isn't accepted at the {carrier} drop-off point.",
            ("Return label not working", "Can't ship my return"),
        ),
        (
            "The tracking number {tracking} you sent me doesn't exist on the {carrier} website.",
            ("Tracking number invalid", "Tracking doesn't work"),
        ),
        (
            "Order {order} was split into two shipments and only one of them has arrived.",
            ("Second parcel missing", "Only half of {order} arrived"),
        ),
    ),
    "product_feedback": (
        (
            "I love my {product}, but it would be great if the app had a dark mode.",
            ("Dark mode please", "Feature request"),
        ),
        (
            "I'd really like to see {feature} added to the Lumo app.",
            ("Feature request", "Suggestion for the app"),
        ),
        (
            "The new app design is much harder to navigate than the old one.",
            ("New app design", "Feedback on the redesign"),
        ),
        (
            "I just wanted to say the {product} has been fantastic, setup took five minutes.",
            ("Love the product!", "Thank you"),
        ),
        (
            "The {product} looks great, but the status light is far too bright at night.",
            ("Status light too bright", "Feedback on the {product}"),
        ),
        (
            "Please consider supporting {integration}, it's the only thing stopping me from "
            "buying more of your devices.",
            ("Integration request", "{integration} support?"),
        ),
        (
            "The {product} is good, but I don't think the extra features in {plan} are worth it "
            "compared to the free tier.",
            ("Thoughts on {plan}", "Feedback on the paid features"),
        ),
        (
            "I'd love a smaller version of the {product} that fits on a windowsill.",
            ("Idea for the {product}", "Smaller version?"),
        ),
        (
            "The setup instructions that came with the {product} were confusing, especially "
            "the part about the mounting bracket.",
            ("Setup instructions feedback", "Confusing manual"),
        ),
        (
            "Your support team was really helpful last week and I wanted to pass on my thanks.",
            ("Thanks to your support team", "Great support"),
        ),
        (
            "The {product} works well, but the plastic casing feels cheap for the price.",
            ("Build quality feedback", "Feedback on the {product}"),
        ),
        (
            "It would be nice if the app let me group devices by room.",
            ("Idea: group devices by room", "Suggestion for the app"),
        ),
        (
            "Suggestion: let us export motion history to a spreadsheet so we can review it "
            "on a computer.",
            ("Export motion history", "Suggestion"),
        ),
        (
            "The latest update made the notifications much more useful, great job.",
            ("Nice update", "Love the new notifications"),
        ),
        (
            "I wish the {product} came in more colours, white doesn't really match my {room}.",
            ("More colours please", "Colour options"),
        ),
        (
            "Feature request: allow more than {n} people in a household to share the app.",
            ("Feature request", "Bigger households"),
        ),
        (
            "The voice prompts on the {product} are too loud and there's no way to turn them down.",
            ("Voice prompts too loud", "Volume setting for prompts"),
        ),
        (
            "Overall I'm very happy with the {product}, but {feature} would be a great addition.",
            ("Happy customer, one idea", "Feature request"),
        ),
    ),
}

_CATEGORY_OPENERS: dict[str, tuple[str, ...]] = {
    "billing": (
        "I have a question about a charge on my account.",
        "I'm writing about my latest bill.",
        "I need help with a payment problem.",
        "I'm contacting you about my subscription billing.",
    ),
    "technical_issue": (
        "I'm having a technical problem with one of my devices.",
        "Something is wrong with my {product}.",
        "I need some help troubleshooting my setup.",
        "I've run into a bug I can't get around.",
    ),
    "account_access": (
        "I'm having trouble getting into my account.",
        "I need help accessing my Lumo account.",
        "I have a problem signing in.",
    ),
    "shipping": (
        "I'm writing about a delivery.",
        "I have a question about order {order}.",
        "I need an update on a package.",
    ),
    "product_feedback": (
        "I wanted to share some feedback.",
        "I have a suggestion for the product team.",
        "Just a bit of feedback from a long-time user.",
    ),
}
_TONE_OPENERS: dict[str, tuple[str, ...]] = {
    "polite": (
        "Hi there, I hope you're doing well.",
        "Hello, I hope someone can help me with this.",
        "Good morning, and thanks in advance for your help.",
        "Hi team, sorry to bother you.",
    ),
    "neutral": (
        "Hello, quick question.",
        "Hi, writing in about an issue.",
        "Hi support.",
        "Hello, my name is {first}.",
    ),
    "frustrated": (
        "This is the third time I'm contacting you about this.",
        "I'm really frustrated right now.",
        "Honestly, I'm losing patience with this.",
        "Nobody has answered my last two messages.",
    ),
}

_DETAILS: dict[str, tuple[str, ...]] = {
    "billing": (
        "The charge shows up as LUMO*SUBSCRIPTION on my statement.",
        "My account email is {email}.",
        "I paid with my {card}.",
        "The order number is {order}, placed on {order_date}.",
        "That's {amount} I hadn't budgeted for this month.",
        "There is only one household on my account, so there should only be one subscription.",
        "I've attached a screenshot of my bank statement.",
        "The invoice number at the top is INV-{inv}.",
        "I've been a customer for {years} years and this has never happened before.",
        "According to my receipt I paid {amount}.",
    ),
    "technical_issue": (
        "I'm using {device} with app version {app_version}.",
        "The {product} is about {m} metres from the router.",
        "It started happening around {date}.",
        "The firmware on the device says {fw}.",
        "The error code shown is {error_code}.",
        "My internet connection is fine, I've checked the speed.",
        "It happens on my phone and on my partner's phone too.",
        "It's on a 2.4 GHz network, as the manual says.",
        "It worked perfectly for the first {n} months.",
        "The device is installed in the {room}.",
    ),
    "account_access": (
        "My account email is {email}.",
        "I've had this account since {year}.",
        "I've checked the spam and promotions folders.",
        "My phone number ends in {last4}.",
        "The last time I logged in successfully was on {date}.",
        "All my devices and recordings are on that account.",
        "I'm trying from {device}.",
        "I can still see the cameras on my partner's phone but not on mine.",
        "The error just says 'Invalid credentials'.",
        "I've tried in {browser} as well as in the app.",
    ),
    "shipping": (
        "The order number is {order}.",
        "The tracking number is {tracking} with {carrier}.",
        "I placed the order on {order_date}.",
        "My delivery address is in {city}.",
        "I need it before the weekend because it's a gift.",
        "I paid extra for express delivery.",
        "The confirmation email said it would take three to five working days.",
        "The last tracking update says 'in transit' at a {carrier} depot.",
        "I live in a flat, so parcels normally go to the front desk.",
        "It's now {days_n} days past the estimated delivery date.",
    ),
    "product_feedback": (
        "I've had my {product} for about {n} months now.",
        "I use it mostly in the {room}.",
        "My whole family uses the app every day.",
        "I own {n} Lumo devices at this point.",
        "My neighbour's camera from another brand already does this.",
        "I'm on {device}, if that matters.",
        "This is just feedback, no reply needed.",
        "It's a small thing, but it comes up every day.",
        "I'd happily pay a little more for it.",
        "I've recommended Lumo to a few friends already.",
    ),
}

_TRIED: dict[str, tuple[str, ...]] = {
    "billing": (
        "I checked my banking app and both payments have gone through.",
        "I already called my bank and they told me to ask you.",
        "I looked in the billing section of the app but there's no option to dispute it.",
        "I tried re-entering the discount code but it says it's already been used.",
        "I emailed billing last week but haven't heard back.",
        "I checked the pricing page and it still shows the lower price.",
        "I tried to cancel in the app but the button is greyed out.",
        "I downloaded the invoice from my account page and the total doesn't match.",
    ),
    "technical_issue": (
        "I've already restarted the {product} and my router.",
        "I tried uninstalling and reinstalling the app.",
        "I did a factory reset and set it up from scratch, but the problem came back.",
        "I moved it closer to the router and it made no difference.",
        "I cleared the app cache and logged out and back in.",
        "I tried a different power adapter.",
        "I followed the troubleshooting guide on your website step by step.",
        "I tried switching my phone from Wi-Fi to mobile data.",
    ),
    "account_access": (
        "I've reset my password {n} times already.",
        "I tried the 'forgot password' link and nothing came.",
        "I tried logging in from a different browser and a different device.",
        "I waited 24 hours like the lockout message said, but it's still locked.",
        "I checked that caps lock was off and typed it very carefully.",
        "I tried using my backup codes but I can't find them anywhere.",
        "I cleared my cookies and tried in a private window.",
        "I asked my partner to send me a household invite, but it goes to my old email.",
    ),
    "shipping": (
        "I contacted {carrier} and they said to ask the sender.",
        "I've been checking the tracking page several times a day.",
        "I asked my neighbours and checked behind the bins and in the garage.",
        "The order page in my account still just says 'shipped'.",
        "I waited an extra {n} days in case it was only delayed.",
        "I've kept the confirmation email and all the packaging.",
        "I tried the live chat but it disconnected before anyone answered.",
        "I double-checked the address on the order and it's correct.",
    ),
    "product_feedback": (
        "I looked through all the settings but couldn't find an option for this.",
        "I searched your help centre and the community forum.",
        "I tried a workaround with a third-party app but it's clunky.",
        "I asked on the community forum and other people want this too.",
        "I read the release notes for the last few updates hoping it was coming.",
        "I've been making do, but it would make a real difference.",
    ),
}

# A second topic mentioned in passing, so the main topic has to be told from a distractor.
_ASIDES: dict[str, tuple[str, ...]] = {
    "billing": (
        "Unrelated, but my last invoice still shows my old address.",
        "Also, while you're at it, could you send me last month's receipt?",
        "Separately, I might switch to the annual plan later, but that can wait.",
    ),
    "technical_issue": (
        "Side note, the app crashed once this week too, but that's minor.",
        "Also, the app has felt a bit slow lately, not a big deal.",
        "By the way, one of my plugs dropped off the network yesterday, but it came back.",
    ),
    "account_access": (
        "Separately, I'd like to add my partner to the account at some point.",
        "Also, my login email is still my old work address, but that can wait.",
        "On another note, I had to reset my password last month too.",
    ),
    "shipping": (
        "By the way, my other order arrived fine, so thanks for that.",
        "Also, the replacement charger I ordered is still on its way, no rush.",
        "Side note, the last parcel came a day late, but it was fine.",
    ),
    "product_feedback": (
        "By the way, I really like the new app icon.",
        "On a positive note, setup was really easy.",
        "Otherwise I'm happy with the devices.",
    ),
}

_CLOSERS: dict[str, tuple[str, ...]] = {
    "polite": (
        "Thanks so much for your help!",
        "Any help would be greatly appreciated.",
        "Thank you in advance, {first}.",
        "Looking forward to hearing from you.",
        "Thanks for your time.",
        "Many thanks, {first}.",
    ),
    "neutral": (
        "Please let me know what to do next.",
        "Can you look into this?",
        "Let me know if you need anything else from me.",
        "Please advise.",
        "What are my options?",
        "Thanks.",
    ),
    "frustrated": (
        "I expect this to be fixed today.",
        "If this isn't sorted out soon I'll be cancelling.",
        "Please don't send me another canned response.",
        "This is really unacceptable.",
        "I want a real answer this time.",
        "Fix it please!!",
    ),
}

_FEEDBACK_CLOSERS: dict[str, tuple[str, ...]] = {
    "polite": (
        "Thanks for listening!",
        "Keep up the good work.",
        "Thanks for considering it, {first}.",
        "Cheers, and thanks for a great product.",
    ),
    "neutral": (
        "Just my two cents.",
        "Hope that's useful.",
        "Would be good to know if this is planned.",
        "Thanks.",
    ),
    "frustrated": (
        "Please actually pass this on to the product team this time.",
        "I really hope you change it back.",
        "Honestly it's a bit disappointing.",
    ),
}
_MISSPELLINGS: dict[str, str] = {
    "receive": "recieve",
    "receiving": "recieving",
    "definitely": "definately",
    "separate": "seperate",
    "the": "teh",
    "because": "becuase",
    "account": "acount",
    "payment": "payemnt",
    "password": "pasword",
    "address": "adress",
    "really": "realy",
    "until": "untill",
    "already": "allready",
    "tomorrow": "tommorow",
}
_LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "INFO", "WARN", "ERROR")
_LOG_SOURCES: tuple[str, ...] = (
    "[main] com.lumo.app.MainActivity",
    "[sync-worker-2] com.lumo.sync.UploadTask",
    "[stream-io] com.lumo.video.RtspClient",
    "[okhttp] com.lumo.net.ApiClient",
    "[ble-scan] com.lumo.pairing.BleScanner",
    "[render] com.lumo.video.SurfaceRenderer",
)
_LOG_MESSAGES: tuple[str, ...] = (
    "Connection reset by peer (retry {a}/5)",
    "GET /v2/devices/{dev}/stream 503 in {ms}ms",
    "Decoder underrun, dropped {a} frames",
    "java.lang.IllegalStateException: Surface already released",
    "    at com.lumo.video.SurfaceRenderer.draw(SurfaceRenderer.kt:{line})",
    "    at com.lumo.video.RtspClient.onFrame(RtspClient.kt:{line})",
    "Token refresh ok, expires_in=3600",
    "Heartbeat missed for device {dev} ({a} consecutive)",
    "Keyframe request sent to {dev}",
    "Memory pressure: trimming caches to {ms}KB",
)
_WORD = re.compile(r"\b[a-z]{3,}\b")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class GeneratedDemo(BaseModel):
    """What was written, so callers and tests need not re-derive paths or bad-row ids."""

    model_config = ConfigDict(frozen=True)

    inbox_dir: Path
    files: list[Path]
    truth_path: Path
    days: list[dt.date]
    rows_written: int
    bad_rows: dict[str, list[str]]


class _Slots(dict[str, str]):
    """Template values made on first use, so one ticket mentions one order, one product, ..."""

    def __init__(self, rng: random.Random, day: dt.date, first: str, last: str) -> None:
        super().__init__(first=first)
        self._rng = rng
        self._day = day
        self._last = last

    def __missing__(self, key: str) -> str:
        value = self._make(key)
        self[key] = value
        return value

    def _money(self) -> str:
        return f"${self._rng.randint(8, 349)}.{self._rng.choice(('00', '49', '95', '99'))}"

    def _make(self, key: str) -> str:
        r = self._rng
        if key == "order":
            return f"LM-{r.randint(100000, 999999)}"
        if key == "amount":
            return self._money()
        if key == "amount2":
            while (other := self._money()) == self["amount"]:
                pass
            return other
        if key == "card":
            return f"{r.choice(('Visa', 'Mastercard', 'Amex'))} ending in {r.randint(0, 9999):04d}"
        if key == "plan":
            return r.choice(_PLANS)
        if key == "product":
            return self["camera"] if "camera" in self else r.choice(_PRODUCTS)
        if key == "camera":
            if self.get("product") in _CAMERAS:
                return self["product"]
            camera = r.choice(_CAMERAS)
            self.setdefault("product", camera)
            return camera
        if key == "product2":
            return r.choice([p for p in _PRODUCTS if p != self["product"]])
        if key == "device":
            return r.choice(_DEVICES)
        if key == "app_version":
            return f"{r.randint(4, 5)}.{r.randint(0, 19)}.{r.randint(0, 9)}"
        if key == "fw":
            return f"{r.randint(2, 3)}.{r.randint(0, 9)}.{r.randint(10, 99)}"
        if key == "error_code":
            return r.choice(_ERROR_CODES)
        if key == "browser":
            return r.choice(_BROWSERS)
        if key in ("date", "order_date"):
            # Orders are placed well before anything that happens to them.
            back = r.randint(1, 10) if key == "date" else r.randint(12, 30)
            past = self._day - dt.timedelta(days=back)
            return f"{_MONTHS[past.month - 1]} {past.day}"
        if key == "carrier":
            return r.choice(_CARRIERS)
        if key == "tracking":
            alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
            return "".join(r.choice(alphabet) for _ in range(r.choice((12, 14, 18))))
        if key == "city":
            return r.choice(_CITIES)
        if key == "n":
            return str(r.randint(2, 5))
        if key == "days_n":
            return str(r.randint(3, 14))
        if key == "m":
            return str(r.randint(2, 15))
        if key == "room":
            return r.choice(_ROOMS)
        if key == "feature":
            return r.choice(_FEATURES)
        if key == "integration":
            return r.choice(_INTEGRATIONS)
        if key == "inv":
            return str(r.randint(10_000_000, 99_999_999))
        if key == "years":
            return str(r.randint(2, 6))
        if key == "year":
            return str(self._day.year - r.randint(1, 7))
        if key == "last4":
            return f"{r.randint(0, 9999):04d}"
        if key == "email":
            user = _ascii(f"{self['first']}.{self._last}").lower().replace("'", "")
            if r.random() < 0.4:
                user = f"{user}{r.randint(1, 99)}"
            return f"{user}@{r.choice(_EMAIL_DOMAINS)}"
        raise KeyError(key)


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _quotas(total: int) -> list[str]:
    """Largest-remainder split, so per-day counts track the weights exactly."""
    raw = {c: total * w for c, w in _CATEGORY_WEIGHTS.items()}
    counts = {c: int(v) for c, v in raw.items()}
    by_remainder = sorted(CATEGORIES, key=lambda c: (counts[c] - raw[c], CATEGORIES.index(c)))
    for c in by_remainder[: total - sum(counts.values())]:
        counts[c] += 1
    return [c for c in CATEGORIES for _ in range(counts[c])]


def _add_typos(text: str, rng: random.Random) -> str:
    """One or two slips of the keyboard; never inside an email address."""
    words = [
        m
        for m in _WORD.finditer(text)
        if (len(m.group()) >= 4 or m.group() in _MISSPELLINGS)
        and "@" not in text[text.rfind(" ", 0, m.start()) + 1 : m.end()]
        and text[m.end() : m.end() + 1] not in ("@", ".", "'")
    ]
    if not words:
        return text
    chosen = rng.sample(words, k=min(len(words), rng.randint(1, 2)))
    for match in sorted(chosen, key=lambda m: -m.start()):
        word = match.group()
        if word in _MISSPELLINGS:
            typo = _MISSPELLINGS[word]
        else:
            i = rng.randint(1, len(word) - 3)
            typo = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        text = text[: match.start()] + typo + text[match.end() :]
    return text


def _body_sentences(
    category: str, tone: str, channel: str, slots: _Slots, rng: random.Random
) -> tuple[list[str], tuple[str, ...]]:
    """Problem first when filling, so follow-up sentences reuse its order, product, ..."""
    template, subjects = rng.choice(_PROBLEMS[category])
    problem = template.format_map(slots)
    opener: str | None = None
    if rng.random() < (0.25 if channel == "chat" else 0.5):
        pool = _TONE_OPENERS[tone] if rng.random() < 0.5 else _CATEGORY_OPENERS[category]
        opener = rng.choice(pool).format_map(slots)
    details = [
        d.format_map(slots) for d in rng.sample(_DETAILS[category], k=rng.choice((0, 1, 1, 2)))
    ]
    tried = (
        rng.choice(_TRIED[category]).format_map(slots)
        if rng.random() < (0.35 if category == "product_feedback" else 0.55)
        else None
    )
    closers = _FEEDBACK_CLOSERS if category == "product_feedback" else _CLOSERS
    closer = rng.choice(closers[tone]).format_map(slots) if rng.random() < 0.7 else None
    aside: str | None = None
    if rng.random() < 0.12:
        other = rng.choice([c for c in CATEGORIES if c != category])
        aside = rng.choice(_ASIDES[other])

    if not details and tried is None and closer is None:
        details.append(rng.choice(_DETAILS[category]).format_map(slots))
    limit = 4 if channel == "chat" else 6

    def assemble() -> list[str]:
        middle = [s for s in (tried, aside) if s is not None]
        return [s for s in (opener, problem, *details, *middle, closer) if s is not None]

    sentences = assemble()
    # An aside only stays when the main topic still has at least three sentences of its own.
    if aside is not None and len(sentences) < 4:
        aside = None
        sentences = assemble()
    while len(sentences) > limit:
        if details:
            details.pop()
        elif aside is not None:
            aside = None
        elif opener is not None:
            opener = None
        else:
            closer = None
        sentences = assemble()
    return sentences, subjects


def _subject(
    category: str, tone: str, own: tuple[str, ...], slots: _Slots, rng: random.Random
) -> str:
    pool = _SUBJECTS[category] if rng.random() < 0.15 else own
    subject = rng.choice(pool).format_map(slots)
    roll = rng.random()
    if tone == "frustrated" and roll < 0.3:
        return f"URGENT: {subject}" if roll < 0.15 else f"{subject}!!"
    if roll < 0.06:
        return f"Re: {subject}"
    if roll < 0.16:
        return subject.lower()
    return subject


def _good_ticket(
    category: str, day: dt.date, rng: random.Random, seen_bodies: set[str]
) -> dict[str, Any]:
    """One ticket whose body is new across the whole run; a collision simply draws again."""
    for _ in range(100):
        first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
        channel = rng.choices(CHANNELS, weights=_CHANNEL_WEIGHTS)[0]
        tone = rng.choices(_TONES, weights=_TONE_WEIGHTS[category])[0]
        slots = _Slots(rng, day, first, last)
        sentences, subjects = _body_sentences(category, tone, channel, slots, rng)
        body = " ".join(sentences)
        if rng.random() < (0.25 if tone == "frustrated" else 0.1):
            body = _add_typos(body, rng)
        if body in seen_bodies:
            continue
        seen_bodies.add(body)
        return {
            "customer": f"{first} {last}",
            "channel": channel,
            "subject": _subject(category, tone, subjects, slots, rng),
            "body": body,
        }
    raise RuntimeError("could not draw a unique ticket body; the template pools are too small")


def _log_paste(day: dt.date, rng: random.Random) -> str:
    """A pasted app log: realistic, token-dense, and far beyond an 8k-token context window."""
    lines = ["The app crashes every time I open the live view, here is the full log from my phone:"]
    size = len(lines[0])
    millis = rng.randint(8, 20) * 3_600_000
    device = f"cam-{rng.randint(1000, 9999)}"
    while size < OVERSIZED_BODY_CHARS:
        millis += rng.randint(1, 900)
        seconds, ms = divmod(millis, 1000)
        stamp = f"{day.isoformat()}T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:"
        stamp += f"{seconds % 60:02d}.{ms:03d}Z"
        message = rng.choice(_LOG_MESSAGES).format(
            a=rng.randint(1, 5), dev=device, ms=rng.randint(40, 4000), line=rng.randint(40, 900)
        )
        line = f"{stamp} {rng.choice(_LOG_LEVELS)} {rng.choice(_LOG_SOURCES)}: {message}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:OVERSIZED_BODY_CHARS]


def _timestamps(day: dt.date, count: int, rng: random.Random) -> list[str]:
    """Mostly waking hours, some overnight; sorted so each file reads as an inbox."""
    seconds = sorted(
        rng.randint(7 * 3600, 23 * 3600 - 1) if rng.random() < 0.8 else rng.randint(0, 86_399)
        for _ in range(count)
    )
    return [f"{day.isoformat()}T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}Z" for s in seconds]


def _write_atomic(path: Path, text: str) -> None:
    """Readers (or a crashed run) never see a half-written inbox file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _jsonl(rows: list[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def generate_demo_data(
    out_dir: Path,
    start: dt.date,
    days: int = 3,
    tickets_per_day: int = 120,
    seed: int = 7,
) -> GeneratedDemo:
    """Write `days` daily inbox files plus truth.jsonl under `out_dir`; same inputs, same bytes.

    Each day holds `tickets_per_day` good tickets; the first day also holds the five bad rows,
    which are not in the truth file.
    """
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if tickets_per_day < 1:
        raise ValueError(f"tickets_per_day must be >= 1, got {tickets_per_day}")

    rng = random.Random(seed)
    out_dir = Path(out_dir)
    inbox_dir = out_dir / "inbox"
    seen_bodies: set[str] = set()
    truth: list[dict[str, str]] = []
    files: list[Path] = []
    day_list = [start + dt.timedelta(days=i) for i in range(days)]
    bad_rows: dict[str, list[str]] = {}
    rows_written = 0

    for index, day in enumerate(day_list):
        categories = _quotas(tickets_per_day)
        rng.shuffle(categories)
        # Entries are (kind, row, category); ids and timestamps are assigned in file order below.
        entries: list[tuple[str, dict[str, Any], str | None]] = [
            ("good", _good_ticket(c, day, rng, seen_bodies), c) for c in categories
        ]
        duplicate_of: dict[str, Any] | None = None
        if index == 0:
            original_at = rng.randrange(max(1, len(entries) // 2))
            duplicate_of = entries[original_at][1]
            extra_category = rng.choice(CATEGORIES)
            bad: list[tuple[str, dict[str, Any]]] = [
                (
                    "empty_body",
                    {**_good_ticket(extra_category, day, rng, seen_bodies), "body": "   "},
                ),
                ("duplicate_id", _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies)),
                ("missing_date", _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies)),
                (
                    "oversized_body",
                    {
                        "customer": f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}",
                        "channel": "email",
                        "subject": "App crash log attached",
                        "body": _log_paste(day, rng),
                    },
                ),
                ("missing_id", _good_ticket(rng.choice(CATEGORIES), day, rng, seen_bodies)),
            ]
            for kind, row in bad:
                if kind == "duplicate_id":
                    after = next(i for i, e in enumerate(entries) if e[1] is duplicate_of)
                    position = rng.randint(after + 1, len(entries))
                else:
                    position = rng.randint(0, len(entries))
                entries.insert(position, (kind, row, None))

        stamps = iter(_timestamps(day, len(entries), rng))
        seq = 0
        lines: list[dict[str, Any]] = []
        for kind, row, category in entries:
            created_at = next(stamps)
            if kind == "duplicate_id":
                assert duplicate_of is not None
                ticket_id: str | None = duplicate_of["ticket_id"]
            elif kind == "missing_id":
                ticket_id = None
            else:
                seq += 1
                ticket_id = f"T-{day:%Y%m%d}-{seq:04d}"
            line: dict[str, Any] = {}
            if ticket_id is not None:
                line["ticket_id"] = ticket_id
                row["ticket_id"] = ticket_id
            if kind != "missing_date":
                line["created_at"] = created_at
            line.update({k: row[k] for k in ("customer", "channel", "subject", "body")})
            lines.append(line)
            if kind == "good":
                assert category is not None and ticket_id is not None
                truth.append({"ticket_id": ticket_id, "category": category})
            else:
                bad_rows.setdefault(kind, []).append(ticket_id or MISSING_ID)

        path = inbox_dir / f"tickets-{day.isoformat()}.jsonl"
        _write_atomic(path, _jsonl(lines))
        files.append(path)
        rows_written += len(lines)

    truth_path = out_dir / "truth.jsonl"
    _write_atomic(truth_path, _jsonl(truth))
    return GeneratedDemo(
        inbox_dir=inbox_dir,
        files=files,
        truth_path=truth_path,
        days=day_list,
        rows_written=rows_written,
        bad_rows={reason: bad_rows[reason] for reason in BAD_ROW_REASONS},
    )
