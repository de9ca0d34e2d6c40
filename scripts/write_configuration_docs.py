"""Writes docs/configuration.md from the settings' declarations: python scripts/write_configuration_docs.py"""

from pathlib import Path

from encoderrt.deploy.settings import configuration_page

if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    target.write_text(configuration_page(), encoding="utf-8")
    print(f"wrote {target}")
