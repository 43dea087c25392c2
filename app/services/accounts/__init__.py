"""Accounts: who is asking, and may they.

Users, roles, disabled accounts and the forced password change (`auth`, which
every handler asks on every call), sign-in that resists guessing (`signin`),
and the server's book of who is signed in: session tokens, Gradio session
hashes, open studies and uploads (`sessions`).
"""
