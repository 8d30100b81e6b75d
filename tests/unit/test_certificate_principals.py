"""A client certificate's principal (`broker.server.auth.tls.subject_principal`): its
subject written as RFC 4514 writes a distinguished name, so that no attribute value
can spell other attributes (issue 34: a CN of `alice,OU=payments` took the grant of
CN=alice,OU=payments). Checked against `cryptography`'s own RFC 4514 writer on real
certificate files, decoded by `ssl` as the broker decodes them."""

from __future__ import annotations

import pytest
from cryptography import x509

from broker.server.auth.tls import certificate_principal, escape_dn_value, subject_principal
from harness.certificates import CertificateAuthority

NAMES = ["alice", "alice,OU=payments", "a+b", 'quote"d', "semi;colon", "<angle>", "back\\slash", "#hash",
         " leading", "trailing ", "in side", "mid#dle", "ünïcode"]


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.mark.parametrize("common_name", NAMES)
def test_a_certificates_principal_is_its_subject_in_rfc_4514(ca, common_name):
    issued = ca.issue(common_name, unit="payments")
    subject = x509.load_pem_x509_certificate(issued.certfile.read_bytes()).subject
    assert certificate_principal(str(issued.certfile)) == "User:" + subject.rfc4514_string()


def test_a_common_name_cannot_spell_another_subject(ca):
    crafted = certificate_principal(str(ca.issue("alice,OU=payments").certfile))
    genuine = certificate_principal(str(ca.issue("alice", unit="payments").certfile))
    assert genuine == "User:CN=alice,OU=payments,O=logbus-tests"
    assert crafted == "User:CN=alice\\,OU=payments,O=logbus-tests"


def test_a_multi_valued_rdn_joins_its_attributes_with_plus():
    subject = ((("organizationName", "logbus"),), (("commonName", "alice"), ("userId", "a+1")))
    assert subject_principal(subject) == "User:CN=alice+userId=a\\+1,O=logbus"
    assert subject_principal(subject) != subject_principal(
        ((("organizationName", "logbus"),), (("userId", "a+1"),), (("commonName", "alice"),)))


@pytest.mark.parametrize("value, escaped", [
    ("", ""), (" ", "\\ "), ("  ", "\\ \\ "), ("#", "\\#"), ("a\0b", "a\\00b"), ("a=b", "a=b"),
])
def test_edge_values_are_escaped(value, escaped):
    assert escape_dn_value(value) == escaped


def test_no_subject_is_anonymous():
    assert subject_principal(()) == "User:ANONYMOUS"
