"""The source of a catalog price, read back from its ``sources.price_per_hour`` string.

Every catalog price is a cloud's on-demand list price for one instance divided by its GPUs,
and its source says so in one format, so that the plan summary can name the cloud, region and
date a default rests on and a test can check each figure against the instance price it cites:

    "<cloud> <instance> on-demand <instance USD/h> / <n> GPUs, <region>, <URL>, <date>[; note]"

``<date>`` is an ISO date (the page's own date, else the day it was read) or "date not stated".
A figure that no page found here backs keeps its old source behind ``UNVERIFIED_PREFIX``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNVERIFIED_PREFIX = "not re-verified:"

# The instance may hold spaces ("1x NVIDIA GH200"); the region and date may not hold commas.
_FORMAT = re.compile(
    r"^(?P<cloud>\S+) (?P<instance>.+?) on-demand (?P<instance_usd>\d+(?:\.\d+)?) / (?P<gpus>\d+) GPUs?, "
    r"(?P<region>[^,]+), (?P<url>https?://[^\s,]+), (?P<date>\d{4}-\d{2}-\d{2}|date not stated)"
    r"(?:; (?P<note>.+))?$")


@dataclass(frozen=True)
class PriceSource:
    """One catalog price's source: an instance's on-demand list price on one cloud."""

    cloud: str
    instance: str
    instance_usd_per_hour: float
    gpus_per_instance: int
    region: str
    url: str
    date: str
    note: str | None = None

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.instance_usd_per_hour / self.gpus_per_instance

    def short(self) -> str:
        """Cloud, instance, region and date, for a one-line summary (the URL stays in the catalog)."""
        when = self.date if self.date == "date not stated" else f"list price of {self.date}"
        return f"{self.cloud} {self.instance} on-demand, {self.region}, {when}"


def parse_price_source(text: str) -> PriceSource | None:
    """The parts of a source string in the catalog format, or None for any other text (an
    unverified figure, a null price's reason, a user's own GPU)."""
    found = _FORMAT.match(text.strip())
    if found is None:
        return None
    gpus = int(found["gpus"])
    if gpus < 1:
        return None
    return PriceSource(cloud=found["cloud"], instance=found["instance"],
                       instance_usd_per_hour=float(found["instance_usd"]), gpus_per_instance=gpus,
                       region=found["region"].strip(), url=found["url"], date=found["date"],
                       note=found["note"])
