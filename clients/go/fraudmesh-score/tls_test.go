package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	fraudv1 "github.com/fraudmesh/fraudmesh/gen/go/fraud/v1"
)

// testPKI is a throw-away CA with a server certificate for 127.0.0.1 and a client one.
type testPKI struct {
	dir                   string
	ca                    *x509.Certificate
	caKey                 *ecdsa.PrivateKey
	caFile                string
	server                tls.Certificate
	clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := testPKI{dir: dir, ca: ca, caKey: caKey, caFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	serverCert, serverKey := p.issue(t, 2, x509.ExtKeyUsageServerAuth)
	server, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	p.server = server
	clientCert, clientKey := p.issue(t, 3, x509.ExtKeyUsageClientAuth)
	p.clientCert, p.clientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(p.clientCert, clientCert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.clientKey, clientKey, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue returns a PEM certificate and key signed by the CA, valid for 127.0.0.1.
func (p testPKI) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	template := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// securedScoring answers Score only with the expected bearer token, as the edge would.
type securedScoring struct {
	fraudv1.UnimplementedFraudScoringServer
	token string
}

func (s securedScoring) Score(ctx context.Context, req *fraudv1.ScoreRequest) (*fraudv1.ScoreResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+s.token {
		return nil, status.Error(codes.Unauthenticated, "Jwt is missing")
	}
	return &fraudv1.ScoreResponse{TransactionId: req.GetTransactionId(), Decision: fraudv1.Decision_DECISION_APPROVE}, nil
}

// serveMutualTLS starts a server that requires a client certificate from the test CA.
func serveMutualTLS(t *testing.T, p testPKI, token string) string {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.server}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer(grpc.Creds(creds))
	fraudv1.RegisterFraudScoringServer(server, securedScoring{token: token})
	go func() { _ = server.Serve(lis) }()
	t.Cleanup(server.Stop)
	return lis.Addr().String()
}

func TestMutualTLSWithToken(t *testing.T) {
	p := newTestPKI(t)
	addr := serveMutualTLS(t, p, "secret-token")
	tokenFile := filepath.Join(p.dir, "token")
	if err := os.WriteFile(tokenFile, []byte("secret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := with("-addr", addr, "-timeout", "5s", "-connect-timeout", "5s", "-ca", p.caFile)

	var stdout, stderr bytes.Buffer
	args := append(append([]string{}, base...), "-cert", p.clientCert, "-key", p.clientKey, "-token-file", tokenFile)
	if got := run(context.Background(), args, &stdout, &stderr); got != exitOK {
		t.Fatalf("mutual TLS with token: exit %d, stderr %s", got, stderr.String())
	}
	if !strings.Contains(stdout.String(), "decision     APPROVE") {
		t.Errorf("stdout = %q", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	t.Setenv(tokenEnv, "")
	args = append(append([]string{}, base...), "-cert", p.clientCert, "-key", p.clientKey)
	if got := run(context.Background(), args, &stdout, &stderr); got != exitRPCError {
		t.Fatalf("no token: exit %d, want %d", got, exitRPCError)
	}
	if !strings.Contains(stderr.String(), "UNAUTHENTICATED") {
		t.Errorf("no token: stderr = %q", stderr.String())
	}

	stderr.Reset()
	t.Setenv(tokenEnv, "secret-token")
	if got := run(context.Background(), args, &stdout, &stderr); got != exitOK {
		t.Fatalf("token from $%s: exit %d, stderr %s", tokenEnv, got, stderr.String())
	}

	stderr.Reset()
	// The handshake fails until the connect timeout: keep it short.
	args = append(append([]string{}, base...), "-connect-timeout", "500ms")
	if got := run(context.Background(), args, &stdout, &stderr); got != exitRPCError {
		t.Errorf("no client certificate: exit %d, want %d (stderr %s)", got, exitRPCError, stderr.String())
	}
}

func TestTLSFlagProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"cert without key", with("-cert", "c.pem"), "-cert and -key go together"},
		{"key without cert", with("-key", "k.pem"), "-cert and -key go together"},
		{"server name without tls", with("-server-name", "edge"), "-server-name needs -tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseFlags error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if got := run(context.Background(), with("-ca", filepath.Join(t.TempDir(), "missing.pem")), &stdout, &stderr); got != exitUsage {
		t.Errorf("missing CA file: exit %d, want %d", got, exitUsage)
	}
	if got := run(context.Background(), with("-tls", "-token-file", filepath.Join(t.TempDir(), "none")), &stdout, &stderr); got != exitUsage {
		t.Errorf("missing token file: exit %d, want %d", got, exitUsage)
	}
}
