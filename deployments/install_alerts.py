"""Install (or update) the failure alert of deployments/alerts.yaml on the Prefect server.

    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python deployments/install_alerts.py --block slack-webhook/eagle3-alerts

--block names an existing notification block as <block type slug>/<block name> (the UI shows both
on the block's page). The automation of the same name is replaced, so this is safe to run again.
Exit codes: 0 installed, 2 bad input (no such block, not a notification block, bad file).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parent / "alerts.yaml"
PLACEHOLDER = "{{ notification_block }}"


def automation_spec(path: Path, block_id: str) -> dict:
    """The automation of `path` with the block id in place of the placeholder."""
    spec = yaml.safe_load(path.read_text())
    actions = [a for a in spec.get("actions", []) if a.get("block_document_id") == PLACEHOLDER]
    if not actions:
        raise ValueError(f"{path}: no action has block_document_id: {PLACEHOLDER!r}")
    for action in actions:
        action["block_document_id"] = block_id
    return spec


def install(block: str, path: Path = ALERTS) -> str:
    """Returns the new automation's id; ValueError (with the fix) on bad input."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore
    from prefect.exceptions import ObjectNotFound

    slug, _, name = block.partition("/")
    if not slug or not name:
        raise ValueError(f"--block {block!r}: give <block type slug>/<block name>, e.g. slack-webhook/eagle3-alerts")
    with get_client(sync_client=True) as client:
        try:
            doc = client.read_block_document_by_name(name, slug, include_secrets=False)
        except ObjectNotFound:
            raise ValueError(f"--block {block!r}: no {slug} block named {name!r} on {client.api_url}; create it "
                             "in the UI (Blocks, +) or in Python (deployments/README.md, Alerts)") from None
        if "notify" not in (doc.block_schema.capabilities if doc.block_schema else []):
            raise ValueError(f"--block {block!r}: a {slug} block cannot send notifications; use a notification "
                             "block (Slack Webhook, Custom Webhook, Microsoft Teams Webhook, Sendgrid Email, ...)")
        automation = AutomationCore.model_validate(automation_spec(path, str(doc.id)))
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        return str(client.create_automation(automation))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", required=True, help="notification block: <block type slug>/<block name>")
    ap.add_argument("--file", type=Path, default=ALERTS, help="automation file (default: deployments/alerts.yaml)")
    args = ap.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set; alerts live on the Prefect server the deployments use:\n"
              "  export PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 2
    try:
        automation_id = install(args.block, args.file)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"installed automation eagle3-run-failed ({automation_id}): failed, crashed or timed-out eagle3 flow runs "
          f"notify through {args.block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
