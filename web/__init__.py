"""web: ``ags serve``, a session browser in the web browser, built on the store.

It reads and changes the store through the ``objstore`` API only and renders
transcripts with agent/transcript.py. Imports point one way: ``cli -> web ->
agent -> objstore``. See app.py for the parts and guard.py for what keeps
it safe.
"""
