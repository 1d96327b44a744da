"""Session-wide fixtures. Component fixtures live in their own plugin modules listed here."""

pytest_plugins = ["tests.openbao_fixture"]
