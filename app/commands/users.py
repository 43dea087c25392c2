"""Add, list and disable users, and reset passwords.

A new user gets a generated one-time password, printed once and never stored in
clear, which they must change at first sign-in; `--password-stdin` reads one
instead (for scripts), so a password never appears in the shell history.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add a user (prints a one-time password unless --password-stdin)")
    add.add_argument("name", help="username: letters, digits, '.', '_' or '-'")
    add.add_argument("--admin", action="store_true", help="an administrator (default: radiologist)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    sub.add_parser("list", help="list users")
    disable = sub.add_parser("disable", help="disable a user (sign-in refused; history kept)")
    disable.add_argument("name")
    enable = sub.add_parser("enable", help="enable a disabled user again")
    enable.add_argument("name")
    passwd = sub.add_parser(
        "passwd", help="reset a user's password (prints a one-time password unless --password-stdin)"
    )
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")


def _cli_actor() -> str:
    import getpass  # noqa: PLC0415 -- keeps `orapo --help` light

    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no login name in some containers
        return "cli"


def _read_password() -> str:
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    line = sys.stdin.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise OrapoError("no_password", "--password-stdin was given but stdin had no password on its first line.")
    return password


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db.repositories.users import UserRepository, generate_password  # noqa: PLC0415 -- loads sqlalchemy

    database = open_database()
    users = UserRepository(database)
    actor = _cli_actor()
    try:
        if args.users_command == "add":
            role = "admin" if args.admin else "radiologist"
            if args.password_stdin:
                user = users.create(args.name, _read_password(), role=role, actor=actor)
                print(f"Added {user.role} {user.username}.")
            else:
                user, password = users.create_with_one_time_password(args.name, role=role, actor=actor)
                print(f"Added {user.role} {user.username}. One-time password (must be changed at first sign-in):")
                print(password)
        elif args.users_command == "list":
            rows = users.list()
            if not rows:
                print("No users yet: add one with `orapo users add NAME --admin`.")
            for u in rows:
                flags = [u.role, "active" if u.active else "disabled"]
                if u.must_change_password:
                    flags.append("must change password")
                print(f"{u.username}\t{', '.join(flags)}\tcreated {u.created_at:%Y-%m-%d %H:%M} UTC")
        elif args.users_command == "disable":
            print(f"Disabled {users.disable(args.name, actor=actor).username}.")
        elif args.users_command == "enable":
            print(f"Enabled {users.enable(args.name, actor=actor).username}.")
        elif args.users_command == "passwd":
            if args.password_stdin:
                user = users.set_password(args.name, _read_password(), actor=actor)
                print(f"Password of {user.username} changed.")
            else:
                password = generate_password()
                user = users.set_password(args.name, password, must_change_password=True, actor=actor)
                print(f"Password of {user.username} reset. One-time password (must be changed at first sign-in):")
                print(password)
        return 0
    finally:
        database.dispose()
